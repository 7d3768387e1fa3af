/* SPDX-License-Identifier: MIT
 * The consumer's decisions: the clock bound and the verdict on one delivery. Pure: every
 * time comes in as a value (docs/design.md, "The clock rule"). */
#include "decision_int.h"

#include <string.h>

#include "ladder_int.h"

void lapse__clock_init(lapse__clock_t *clk) {
    *clk = (lapse__clock_t){.offset_ms = INT64_MIN, .wall_minus_mono = INT64_MIN};
}

void lapse__clock_forget(lapse__clock_t *clk) {
    clk->offset_ms = INT64_MIN;
    clk->offset_mono_ms = 0;
}

bool lapse__clock_observe(lapse__clock_t *clk, int64_t wall_ms, int64_t mono_ms,
                          int64_t *step_ms) {
    int64_t offset = lapse__time_add(wall_ms, -mono_ms);
    int64_t before = clk->wall_minus_mono;
    clk->wall_minus_mono = offset;
    if (before == INT64_MIN) {
        return false;
    }
    int64_t step = lapse__time_add(offset, -before);
    if (step <= LAPSE__CLOCK_STEP_MS && step >= -LAPSE__CLOCK_STEP_MS) {
        return false;
    }
    /* The floor itself does not move with the wall clock, but a step says a clock is not
     * what it was (on a shared host, maybe the broker's too): start over from samples
     * taken after it, as docs/design.md asks. */
    lapse__clock_forget(clk);
    clk->steps++;
    if (step_ms) {
        *step_ms = step;
    }
    return true;
}

void lapse__clock_sample(lapse__clock_t *clk, int64_t mono_ms, int64_t broker_ms) {
    int64_t offset = lapse__time_add(broker_ms, -mono_ms);
    /* A sample that waited in a backlog has a smaller offset and changes nothing; the
     * freshest prompt delivery sets the floor. A later sample of the same offset renews
     * it (its age, and so its drift allowance, starts again). */
    if (clk->offset_ms == INT64_MIN || offset >= clk->offset_ms) {
        clk->offset_ms = offset;
        clk->offset_mono_ms = mono_ms;
    }
}

int64_t lapse__clock_floor(const lapse__clock_t *clk, int64_t mono_ms) {
    if (clk->offset_ms == INT64_MIN) {
        return INT64_MIN;
    }
    int64_t age = mono_ms - clk->offset_mono_ms;
    if (age < 0) {
        age = 0; /* a sample from the future of this process: cannot happen, be safe */
    }
    if (age > LAPSE__CLOCK_STALE_MS) {
        return INT64_MIN;
    }
    /* Round the allowance up, so that a young sample is lowered by at least 1 ms a
     * second rather than by nothing. */
    int64_t drift = (age * LAPSE__CLOCK_DRIFT_PPM + 999999) / 1000000;
    return lapse__time_add(lapse__time_add(mono_ms, clk->offset_ms), -drift);
}

int64_t lapse__clock_ahead_ms(const lapse__clock_t *clk, int64_t wall_ms,
                              int64_t mono_ms) {
    int64_t floor = lapse__clock_floor(clk, mono_ms);
    if (floor == INT64_MIN) {
        return INT64_MAX;
    }
    int64_t ahead = lapse__time_add(wall_ms, -floor);
    return ahead < 0 ? 0 : ahead;
}

int64_t lapse__clock_decide_now(const lapse__clock_t *clk, int64_t wall_ms,
                                int64_t mono_ms) {
    int64_t floor = lapse__clock_floor(clk, mono_ms);
    if (floor == INT64_MIN) {
        return LAPSE__NOTHING_DUE;
    }
    return lapse__time_add(wall_ms, -floor) <= LAPSE__SKEW_TOLERANCE_MS ? wall_ms : floor;
}

int64_t lapse__clock_sweep_now(const lapse__clock_t *clk, int64_t wall_ms,
                               int64_t mono_ms) {
    int64_t floor = lapse__clock_floor(clk, mono_ms);
    if (floor == INT64_MIN) {
        return LAPSE__NOTHING_DUE;
    }
    return floor < wall_ms ? floor : wall_ms;
}

int64_t lapse__retry_delay_ms(int attempt) {
    if (attempt < 1) {
        attempt = 1;
    }
    /* 2^19 s is far past the cap: stop shifting there. */
    int64_t delay = INT64_C(1000) << (attempt - 1 < 19 ? attempt - 1 : 19);
    return delay > LAPSE__RETRY_MAX_DELAY_MS ? LAPSE__RETRY_MAX_DELAY_MS : delay;
}

static void verdict(lapse__verdict_t *out, lapse__action_t action, lapse__why_t why,
                    int64_t delay_ms, int attempts) {
    *out = (lapse__verdict_t){
        .action = action, .why = why, .delay_ms = delay_ms, .attempts = attempts};
}

void lapse__decide(const lapse__facts_t *f, lapse__verdict_t *out) {
    if (!f->decoded) {
        verdict(out, LAPSE__ACT_PARK, LAPSE__WHY_UNDECODABLE, 0, f->attempts);
        return;
    }
    /* A row locked by another transaction (LAPSE_CANCEL_BUSY) settled nothing either:
     * only that order takes the retry path, not its batch. */
    if (!f->settled || f->outcome == LAPSE_CANCEL_BUSY) {
        int attempt = f->attempts + 1;
        if (attempt >= f->max_attempts) {
            verdict(out, LAPSE__ACT_PARK, LAPSE__WHY_EXHAUSTED, 0, attempt);
        } else {
            verdict(out, LAPSE__ACT_RETRY, LAPSE__WHY_STORE_FAILED,
                    lapse__retry_delay_ms(attempt), attempt);
        }
        return;
    }
    switch (f->outcome) {
        case LAPSE_CANCEL_DONE:
            verdict(out, LAPSE__ACT_CANCELLED, LAPSE__WHY_NONE, 0, f->attempts);
            return;
        case LAPSE_CANCEL_NOOP_PAID:
            verdict(out, LAPSE__ACT_NOOP, LAPSE__WHY_PAID, 0, f->attempts);
            return;
        case LAPSE_CANCEL_NOOP_CANCELLED:
            verdict(out, LAPSE__ACT_NOOP, LAPSE__WHY_CANCELLED, 0, f->attempts);
            return;
        case LAPSE_CANCEL_UNKNOWN:
            verdict(out, LAPSE__ACT_PARK, LAPSE__WHY_UNKNOWN, 0, f->attempts);
            return;
        case LAPSE_CANCEL_EARLY:
        case LAPSE_CANCEL_BUSY: /* handled above */
            break;
    }
    /* Never act early: the remainder goes down the ladder, whose TTLs run on the broker,
     * at least one second (so it cannot spin) and at most the ladder's span (a longer
     * wait comes back and goes again). An early message keeps its attempts: a store
     * failure earlier does not make a wait count against it. */
    int64_t remaining = lapse__time_add(f->deadline_ms, -f->now_ms);
    if (f->now_ms == LAPSE__NOTHING_DUE || remaining < 1000) {
        remaining = 1000;
    }
    if (remaining > LAPSE__LADDER_MAX_MS) {
        remaining = LAPSE__LADDER_MAX_MS;
    }
    verdict(out, LAPSE__ACT_EARLY, f->undated ? LAPSE__WHY_UNDATED : LAPSE__WHY_AHEAD,
            remaining, f->attempts);
}

const char *lapse__action_name(lapse__action_t action) {
    switch (action) {
        case LAPSE__ACT_CANCELLED:
            return "cancelled";
        case LAPSE__ACT_NOOP:
            return "noop";
        case LAPSE__ACT_EARLY:
            return "early";
        case LAPSE__ACT_RETRY:
            return "retry";
        case LAPSE__ACT_PARK:
            return "parked";
    }
    return "?";
}

const char *lapse__why_name(lapse__why_t why) {
    switch (why) {
        case LAPSE__WHY_NONE:
            return "none";
        case LAPSE__WHY_AHEAD:
            return "ahead";
        case LAPSE__WHY_UNDATED:
            return "undated";
        case LAPSE__WHY_UNDECODABLE:
            return "undecodable";
        case LAPSE__WHY_UNKNOWN:
            return "unknown order";
        case LAPSE__WHY_STORE_FAILED:
            return "store failed";
        case LAPSE__WHY_EXHAUSTED:
            return "attempts exhausted";
        case LAPSE__WHY_PAID:
            return "paid";
        case LAPSE__WHY_CANCELLED:
            return "cancelled";
    }
    return "?";
}

/* Appends s, cut at end. */
static char *put_text(char *p, const char *end, const char *s) {
    size_t n = strlen(s);
    n = n < (size_t)(end - p) ? n : (size_t)(end - p);
    memcpy(p, s, n);
    return p + n;
}

/* Appends v in decimal, cut at end. */
static char *put_int(char *p, const char *end, int64_t v) {
    char digits[21];
    size_t n = sizeof digits;
    uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
    do {
        digits[--n] = (char)('0' + u % 10);
        u /= 10;
    } while (u > 0);
    if (v < 0) {
        digits[--n] = '-';
    }
    size_t len = sizeof digits - n;
    len = len < (size_t)(end - p) ? len : (size_t)(end - p);
    memcpy(p, digits + n, len);
    return p + len;
}

char *lapse__decision_line(char out[LAPSE__DECISION_LINE_MAX], const char *order_id,
                           const char *name, const int64_t *lag_ms, bool redelivered) {
    const char *end = out + LAPSE__DECISION_LINE_MAX - 1;
    char *p = put_text(out, end, "event=decision order_id=");
    p = put_text(p, end, order_id);
    p = put_text(p, end, " decision=");
    p = put_text(p, end, name);
    if (lag_ms != NULL) {
        p = put_int(put_text(p, end, " lag_ms="), end, *lag_ms);
    }
    p = put_text(p, end, redelivered ? " redelivered=1" : " redelivered=0");
    *p = '\0';
    return out;
}
