/* SPDX-License-Identifier: MIT
 * libpq's table, filled when the first PostgreSQL store opens. LAPSE_LIBPQ_SONAME is the
 * SONAME of the libpq the build compiled against (CMakeLists.txt reads it). */
#include "pq_api_int.h"

lapse__pq_api_t lapse__pq;

static const lapse__dynsym_t syms[] = {LAPSE__PQ_SYMS(LAPSE__DYNSYM_ENTRY, lapse__pq)};

static lapse__dynlib_t libpq = LAPSE__DYNLIB_INIT(LAPSE_LIBPQ_SONAME, syms);

lapse_status_t lapse__pq_load(lapse_error_t *err) {
    return lapse__dynlib_load(&libpq, LAPSE_ERR_STORE_OPEN, err);
}
