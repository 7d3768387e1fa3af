/* SPDX-License-Identifier: MIT
 * The CLI's option table (src/cli/options.c) is consistent with itself and with the
 * config library, the texts made from it name every option, the parser reads options
 * before and after the command, and error texts never carry a URL's password. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

static bool is_shown(const cli_option_t *opt) {
    return !(opt->flags & CLI_HIDDEN);
}

static void test_rows_that_share_a_name_agree(void **state) {
    (void)state;
    for (size_t i = 0; i < cli_n_options; i++) {
        const cli_option_t *a = &cli_options[i];
        assert_non_null(a->name);
        assert_non_null(a->help);
        assert_true(a->help[0] != '\0');
        assert_true(a->commands != 0);
        for (size_t k = i + 1; k < cli_n_options; k++) {
            const cli_option_t *b = &cli_options[k];
            if (strcmp(a->name, b->name) != 0) {
                /* A short letter means one option. */
                if (a->short_name && a->short_name == b->short_name) {
                    fail_msg("-%c is both --%s and --%s", a->short_name, a->name,
                             b->name);
                }
                continue;
            }
            if (a->id != b->id || a->short_name != b->short_name ||
                (a->metavar == NULL) != (b->metavar == NULL) ||
                (a->commands & b->commands) != 0 || a->property || b->property) {
                fail_msg("rows %zu and %zu of --%s disagree", i, k, a->name);
            }
        }
    }
}

static void test_every_setting_is_a_config_property(void **state) {
    (void)state;
    lapse_config_t *cfg = lapse_config_new();
    assert_non_null(cfg);
    for (size_t i = 0; i < cli_n_options; i++) {
        const cli_option_t *opt = &cli_options[i];
        if (!opt->property) {
            assert_int_not_equal(opt->id, CLI_OPT_SETTING);
            continue;
        }
        assert_int_equal(opt->id, CLI_OPT_SETTING);
        assert_non_null(opt->metavar);
        assert_null(opt->def); /* the default is the config library's */
        if (!lapse_config_get(cfg, opt->property)) {
            fail_msg("--%s sets unknown property %s", opt->name, opt->property);
        }
        for (size_t k = i + 1; k < cli_n_options; k++) {
            assert_true(!cli_options[k].property ||
                        strcmp(cli_options[k].property, opt->property) != 0);
        }
        /* Every setting (there are no test hooks): a variable, a default, and an example
         * that is valid and differs from the default. */
        const char *def = lapse_config_property_default(opt->property);
        assert_non_null(lapse_config_property_env(opt->property));
        assert_non_null(def);
        assert_non_null(opt->example);
        lapse_error_t err;
        if (lapse_config_set(cfg, opt->property, opt->example, &err) != LAPSE_OK) {
            fail_msg("--%s example %s: %s", opt->name, opt->example, err.text);
        }
        char example[1100];
        snprintf(example, sizeof example, "%s", lapse_config_get(cfg, opt->property));
        assert_int_equal(lapse_config_set(cfg, opt->property, def, NULL), LAPSE_OK);
        assert_string_not_equal(example, lapse_config_get(cfg, opt->property));
        /* Settings are accepted by `config`, which shows them. */
        assert_true(cli_option_accepts(opt, CLI_CMD_CONFIG));
    }
    /* Every property with a variable has an option. */
    for (size_t p = 0; lapse_config_property_name(p); p++) {
        const char *name = lapse_config_property_name(p);
        bool found = false;
        for (size_t i = 0; i < cli_n_options; i++) {
            found = found || (cli_options[i].property &&
                              strcmp(cli_options[i].property, name) == 0);
        }
        assert_true(found || lapse_config_property_env(name) == NULL);
    }
    lapse_config_free(cfg);
}

static void test_every_command_has_one_row(void **state) {
    (void)state;
    for (int cmd = 0; cmd < CLI_CMD_COUNT_; cmd++) {
        size_t rows = 0;
        for (size_t i = 0; i < cli_n_commands; i++) {
            rows += cli_commands[i].cmd == (cli_cmd_t)cmd;
        }
        assert_int_equal(rows, 1);
        const cli_option_t *help = cli_option_find("help", (cli_cmd_t)cmd);
        assert_non_null(help);
        assert_int_equal(help->id, CLI_OPT_HELP);
    }
    for (size_t i = 0; i < cli_n_commands; i++) {
        const cli_command_t *c = &cli_commands[i];
        assert_ptr_equal(cli_command_find(c->name, c->action), c);
        assert_int_equal(cli_command_has_actions(c->name), c->action != NULL);
        assert_non_null(c->args);
        assert_true(c->summary[0] && c->about[0]);
    }
    assert_null(cli_command_find("parked", NULL));
    assert_null(cli_command_find("status", "list"));
    assert_null(cli_command_find("frob", NULL));
}

/* Output of one generator as a string (caller frees). */
static char *capture(void (*gen)(FILE *), const cli_command_t *c) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    if (gen) {
        gen(f);
    } else {
        cli_help_command(f, c);
    }
    fclose(f);
    return text;
}

static void test_texts_name_every_option(void **state) {
    (void)state;
    char *top = capture(cli_help_top, NULL);
    char *md = capture(cli_help_markdown, NULL);
    for (const char *p = top; *p; p += strcspn(p, "\n") + (p[strcspn(p, "\n")] != 0)) {
        assert_true(strcspn(p, "\n") <= 80);
    }
    assert_true(strncmp(md, "<!-- options:begin", 18) == 0);
    assert_string_equal(md + strlen(md) - 21, "<!-- options:end -->\n");
    for (size_t i = 0; i < cli_n_options; i++) {
        const cli_option_t *opt = &cli_options[i];
        char flag[64], md_flag[64];
        snprintf(flag, sizeof flag, "--%s", opt->name);
        snprintf(md_flag, sizeof md_flag, "`--%s", opt->name);
        assert_int_equal(strstr(top, flag) != NULL, is_shown(opt));
        assert_int_equal(strstr(md, md_flag) != NULL, is_shown(opt));
        const char *env = opt->property ? lapse_config_property_env(opt->property) : NULL;
        if (env) {
            assert_non_null(strstr(top, env));
            assert_non_null(strstr(md, env));
        }
    }
    for (size_t i = 0; i < cli_n_commands; i++) {
        char *help = capture(NULL, &cli_commands[i]);
        char usage[64];
        snprintf(usage, sizeof usage, "usage: lapse %s", cli_commands[i].name);
        assert_true(strncmp(help, usage, strlen(usage)) == 0);
        /* Lines fit a terminal. */
        for (const char *p = help; *p;
             p += strcspn(p, "\n") + (p[strcspn(p, "\n")] != 0)) {
            assert_true(strcspn(p, "\n") <= 80);
        }
        free(help);
    }
    free(top);
    free(md);
}

/* "--dry-run" as the man page writes it: \-\-dry\-run. */
static void roff_flag(const char *name, char *buf, size_t cap) {
    size_t used = (size_t)snprintf(buf, cap, "\\fB\\-\\-");
    for (const char *p = name; *p && used + 3 < cap; p++) {
        if (*p == '-') {
            buf[used++] = '\\';
        }
        buf[used++] = *p;
    }
    buf[used] = '\0';
}

static void test_man_page_names_every_option(void **state) {
    (void)state;
    char *man = capture(cli_help_man, NULL);
    assert_true(strncmp(man, ".\\\"", 3) == 0);
    static const char *const sections[] = {
        ".TH LAPSE 1 ",      ".SH NAME\n",        ".SH SYNOPSIS\n",
        ".SH DESCRIPTION\n", ".SH COMMANDS\n",    ".SH OPTIONS\n",
        ".SH ENVIRONMENT\n", ".SH EXIT STATUS\n", ".SH SEE ALSO\n"};
    for (size_t i = 0; i < sizeof sections / sizeof sections[0]; i++) {
        if (!strstr(man, sections[i])) {
            fail_msg("the man page has no %s", sections[i]);
        }
    }
    /* Every control line is one of the few macros it uses; text is pure ASCII, and a
     * hyphen in text is always escaped (an option's must stay an ASCII minus). */
    static const char *const macros[] = {".\\\" ", ".TH ",  ".SH ",  ".SS\n",
                                         ".TP\n",  ".PP\n", ".br\n", ".B "};
    for (const char *p = man; *p; p += strcspn(p, "\n") + (p[strcspn(p, "\n")] != 0)) {
        size_t len = strcspn(p, "\n");
        for (size_t k = 0; k < len; k++) {
            assert_true((unsigned char)p[k] < 0x80 && p[k] != '\t');
        }
        if (*p == '\'') {
            fail_msg("a line starts with a control character: %.*s", (int)len, p);
        }
        if (*p == '.') {
            bool known = false;
            for (size_t m = 0; m < sizeof macros / sizeof macros[0]; m++) {
                known = known || strncmp(p, macros[m], strlen(macros[m])) == 0;
            }
            if (!known) {
                fail_msg("unexpected control line: %.*s", (int)len, p);
            }
            continue;
        }
        for (size_t k = 0; k < len; k++) {
            if (p[k] == '-' && (k == 0 || p[k - 1] != '\\')) {
                fail_msg("unescaped hyphen: %.*s", (int)len, p);
            }
        }
    }
    for (size_t i = 0; i < cli_n_options; i++) {
        const cli_option_t *opt = &cli_options[i];
        char flag[96];
        roff_flag(opt->name, flag, sizeof flag);
        assert_int_equal(strstr(man, flag) != NULL, is_shown(opt));
        const char *env = opt->property ? lapse_config_property_env(opt->property) : NULL;
        if (env && is_shown(opt)) {
            /* A tag of ENVIRONMENT (only there is a tag a variable), followed by the
             * flag it stands for. */
            char entry[160];
            snprintf(entry, sizeof entry, ".TP\n\\fB%s\\fR\n%s\\fR", env, flag);
            if (!strstr(man, entry)) {
                fail_msg("ENVIRONMENT has no %s", env);
            }
        }
    }
    for (size_t i = 0; i < cli_n_commands; i++) {
        char heading[96];
        snprintf(heading, sizeof heading, ".SS\n\\fBlapse %s%s%s\\fR",
                 cli_commands[i].name, cli_commands[i].action ? " " : "",
                 cli_commands[i].action ? cli_commands[i].action : "");
        if (!strstr(man, heading)) {
            fail_msg("the man page has no section for %s", heading + 4);
        }
    }
    free(man);
}

static void test_redact_hides_url_passwords(void **state) {
    (void)state;
    static const struct {
        const char *in, *out;
    } cases[] = {
        {"amqp://u:s3cr3t@h/%2f", "amqp://u:***@h/%2f"},
        {"amqp://u@h/", "amqp://u@h/"},
        {"amqp://h:5672/", "amqp://h:5672/"},
        {"no url at all", "no url at all"},
        {"postgresql://u:p%40ss@db:5432/x?sslmode=require",
         "postgresql://u:***@db:5432/x?sslmode=require"},
        {"amqp://u:p@ss@h/", "amqp://u:***@h/"},
        {"a amqp://u:one@h/ and postgres://v:two@db/", "a amqp://u:***@h/ and "
                                                       "postgres://v:***@db/"},
        {"unknown command 'amqp://u:s3cr3t@h' (see x)", "unknown command "
                                                        "'amqp://u:***@h' (see x)"},
        {"expected amqp://user:password@host:port/vhost",
         "expected amqp://user:password@host:port/vhost"},
        {"amqp://:s3cr3t@h/", "amqp://:***@h/"},
        {"amqp://@h/", "amqp://@h/"},
        {"amqp://u:1@h/", "amqp://u:***@h/"},
        {"://", "://"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char buf[256];
        assert_string_equal(cli_redact(cases[i].in, buf, sizeof buf), cases[i].out);
    }
    /* Short buffers: cut, never overrun, never the password. */
    for (size_t cap = 1; cap < 24; cap++) {
        char buf[24];
        memset(buf, 'z', sizeof buf);
        cli_redact("amqp://user:s3cr3t@host/", buf, cap);
        assert_true(strlen(buf) < cap);
        assert_null(strstr(buf, "s3"));
        assert_int_equal(buf[cap < sizeof buf ? cap : 0],
                         cap < sizeof buf ? 'z' : buf[0]);
    }
}

/* Writable copies of the arguments, as main() gets them (freed by done()). */
static char *copies[32];

/* Parse args (NULL-terminated, argv[0] added) into a fresh cli; returns cli_parse's. */
static int parse(cli_t *cli, const char *const *args, int *n_pos, char ***pos) {
    memset(cli, 0, sizeof *cli);
    cli->cfg = lapse_config_new();
    assert_non_null(cli->cfg);
    int argc = 0;
    copies[argc++] = strdup("lapse");
    for (size_t i = 0; args[i]; i++) {
        copies[argc++] = strdup(args[i]);
    }
    copies[argc] = NULL;
    *pos = NULL;
    return cli_parse(cli, argc, copies, n_pos, pos);
}

static void done(cli_t *cli, char **pos) {
    free(pos);
    free(cli->given);
    lapse_config_free(cli->cfg);
    for (size_t i = 0; copies[i]; i++) {
        free(copies[i]);
        copies[i] = NULL;
    }
}

static void test_parse_options_anywhere(void **state) {
    (void)state;
    cli_t cli;
    int n;
    char **pos;
    assert_int_equal(parse(&cli,
                           (const char *[]){"--prefix", "a", "publish", "o1", "--hold",
                                            "h1", "--store", "sqlite:x", "--hold=h2",
                                            "--prefix", "b", "--timeout", "5m", NULL},
                           &n, &pos),
                     CLI_RUN);
    assert_int_equal(cli.command->cmd, CLI_CMD_PUBLISH);
    assert_int_equal(n, 1);
    assert_string_equal(pos[0], "o1");
    assert_null(pos[1]);
    /* Settings went to the config, the last flag winning; the rest to the command. */
    assert_string_equal(lapse_config_get(cli.cfg, "prefix"), "b");
    assert_string_equal(lapse_config_get(cli.cfg, "store"), "sqlite:x");
    const char *holds[4];
    assert_int_equal(cli_opt_all(&cli, CLI_OPT_HOLD, holds, 4), 2);
    assert_string_equal(holds[0], "h1");
    assert_string_equal(holds[1], "h2");
    assert_string_equal(cli_opt(&cli, CLI_OPT_TIMEOUT), "5m");
    assert_null(cli_opt(&cli, CLI_OPT_DEADLINE));
    const cli_option_t *prefix = cli_option_find("prefix", CLI_CMD_PUBLISH);
    assert_ptr_equal(cli.from[prefix - cli_options], CLI_FROM_FLAG);
    done(&cli, pos);

    /* Two-word commands, "--" and a switch. */
    assert_int_equal(parse(&cli, (const char *[]){"parked", "-h", NULL}, &n, &pos),
                     CLI_EXIT_OK); /* the group's help */
    done(&cli, pos);
    assert_int_equal(
        parse(&cli, (const char *[]){"sweep", "-n", "--grace", "2m", NULL}, &n, &pos),
        CLI_RUN);
    assert_int_equal(cli.command->cmd, CLI_CMD_SWEEP);
    assert_non_null(cli_opt(&cli, CLI_OPT_DRY_RUN));
    assert_int_equal(cli_setting_ms(&cli, "sweep_grace"), 120000);
    done(&cli, pos);
    assert_int_equal(
        parse(&cli, (const char *[]){"status", "--", "--json", NULL}, &n, &pos), CLI_RUN);
    assert_int_equal(n, 1);
    assert_string_equal(pos[0], "--json");
    assert_null(cli_opt(&cli, CLI_OPT_JSON));
    done(&cli, pos);
}

/* A bad variable is a usage error naming it, for the commands that read it only. */
static void test_parse_variables(void **state) {
    (void)state;
    cli_t cli;
    int n;
    char **pos;
    setenv("LAPSE_PREFIX", "not a prefix!", 1);
    assert_int_equal(parse(&cli, (const char *[]){"config", NULL}, &n, &pos),
                     CLI_EXIT_USAGE);
    done(&cli, pos);
    /* Its flag hides it; help never reads it. */
    assert_int_equal(
        parse(&cli, (const char *[]){"config", "--prefix", "ok", NULL}, &n, &pos),
        CLI_RUN);
    done(&cli, pos);
    assert_int_equal(parse(&cli, (const char *[]){"help", "status", NULL}, &n, &pos),
                     CLI_RUN);
    done(&cli, pos);
    unsetenv("LAPSE_PREFIX");
    setenv("LAPSE_PREFETCH", "0", 1);
    assert_int_equal(parse(&cli, (const char *[]){"consume", NULL}, &n, &pos),
                     CLI_EXIT_USAGE);
    done(&cli, pos);
    assert_int_equal(parse(&cli, (const char *[]){"status", NULL}, &n, &pos), CLI_RUN);
    done(&cli, pos);
    setenv("LAPSE_PREFETCH", "7", 1);
    assert_int_equal(parse(&cli, (const char *[]){"consume", NULL}, &n, &pos), CLI_RUN);
    assert_string_equal(lapse_config_get(cli.cfg, "prefetch"), "7");
    const cli_option_t *row = cli_option_find("prefetch", CLI_CMD_CONSUME);
    assert_string_equal(cli.from[row - cli_options], "LAPSE_PREFETCH");
    done(&cli, pos);
    unsetenv("LAPSE_PREFETCH");
}

static void test_parse_refuses(void **state) {
    (void)state;
    cli_t cli;
    int n;
    char **pos;
    static const char *const cases[][5] = {
        {NULL},
        {"frob", NULL},
        {"status", "--limit", "3", NULL},
        {"status", "--bogus", NULL},
        {"status", "--json=1", NULL},
        {"pending", "--limit", NULL},
        {"parked", NULL},
        {"parked", "frob", NULL},
        {"consume", "--prefetch", "0", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(parse(&cli, cases[i], &n, &pos), CLI_EXIT_USAGE);
        assert_null(pos);
        done(&cli, pos);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rows_that_share_a_name_agree),
        cmocka_unit_test(test_every_setting_is_a_config_property),
        cmocka_unit_test(test_every_command_has_one_row),
        cmocka_unit_test(test_texts_name_every_option),
        cmocka_unit_test(test_man_page_names_every_option),
        cmocka_unit_test(test_redact_hides_url_passwords),
        cmocka_unit_test(test_parse_options_anywhere),
        cmocka_unit_test(test_parse_variables),
        cmocka_unit_test(test_parse_refuses),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
