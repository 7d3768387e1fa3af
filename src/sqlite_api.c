/* SPDX-License-Identifier: MIT
 * libsqlite3's table, filled when the first SQLite store opens. LAPSE_LIBSQLITE3_SONAME
 * is the SONAME of the libsqlite3 the build compiled against (CMakeLists.txt reads it).
 */
#include "sqlite_api_int.h"

lapse__sqlite_api_t lapse__sq;

static const lapse__dynsym_t syms[] = {
    LAPSE__SQLITE_SYMS(LAPSE__DYNSYM_ENTRY, lapse__sq)};

static lapse__dynlib_t libsqlite3 = LAPSE__DYNLIB_INIT(LAPSE_LIBSQLITE3_SONAME, syms);

lapse_status_t lapse__sqlite_load(lapse_error_t *err) {
    return lapse__dynlib_load(&libsqlite3, LAPSE_ERR_STORE_OPEN, err);
}
