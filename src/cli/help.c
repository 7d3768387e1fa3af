/* SPDX-License-Identifier: MIT
 * Help texts and the README's reference, generated from the option table (options.c) and
 * the config library's defaults and variables, so that none of them can drift. */
#include "options.h"

#include <lapse/config.h>

#include <string.h>

#define WIDTH    80 /* columns of the plain-text help */
#define HELP_COL 24 /* where an option's description starts */

/* Print text from column col, wrapped at WIDTH on spaces; continuation lines start at
 * column indent. Ends without a newline; returns the column reached. */
static size_t wrap(FILE *out, const char *text, size_t col, size_t indent) {
    const char *p = text;
    bool first = true;
    while (*p != '\0') {
        size_t word = strcspn(p, " ");
        if (!first && col + 1 + word > WIDTH) {
            fprintf(out, "\n%*s", (int)indent, "");
            col = indent;
        } else if (!first) {
            fputc(' ', out);
            col++;
        }
        first = false;
        fprintf(out, "%.*s", (int)word, p);
        col += word;
        p += word;
        while (*p == ' ') {
            p++;
        }
    }
    return col;
}

bool cli_option_shown(const cli_option_t *opt) {
    return (opt->flags & CLI_HIDDEN) == 0;
}

/* The options a command's help, synopsis and README section list: its own, not the
 * global ones (listed once, apart). `config` takes every setting, but lists only what
 * is its own: the settings are each listed under the command that uses them. */
bool cli_option_listed(const cli_option_t *opt, cli_cmd_t cmd) {
    return cli_option_shown(opt) && opt->commands != CLI_GLOBAL &&
           cli_option_accepts(opt, cmd) && !(cmd == CLI_CMD_CONFIG && opt->property);
}

const char cli_help_about[] = "Cancels unpaid orders when their payment window lapses, "
                              "through RabbitMQ dead-lettering.";
const char cli_help_exit_codes[] = "0 done, 1 failed, 2 usage error, 3 refused by the "
                                   "order's state, 4 no such order";

/* "-n, --dry-run" or "--prefix NAME"; sep goes between the name and the metavar. */
static void flag_text(const cli_option_t *opt, char *buf, size_t cap) {
    char letter[8] = "";
    if (opt->short_name) {
        snprintf(letter, sizeof letter, "-%c, ", opt->short_name);
    }
    snprintf(buf, cap, "%s--%s%s%s", letter, opt->name, opt->metavar ? " " : "",
             opt->metavar ? opt->metavar : "");
}

/* An empty default ("none", as for events_queue) is not shown: the help says what it
 * means. */
const char *cli_option_default(const cli_option_t *opt) {
    const char *def =
        opt->property ? lapse_config_property_default(opt->property) : opt->def;
    return def && def[0] ? def : NULL;
}

const char *cli_option_env(const cli_option_t *opt) {
    return opt->property ? lapse_config_property_env(opt->property) : NULL;
}

/* "every command", or "consume, sweep": the commands that use a setting. */
const char *cli_option_commands(const cli_option_t *opt, char *buf, size_t cap) {
    if (opt->commands == CLI_GLOBAL) {
        return "every command";
    }
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < cli_n_commands; i++) {
        if (cli_option_listed(opt, cli_commands[i].cmd)) {
            char label[32];
            cli_command_label(&cli_commands[i], label, sizeof label);
            int n = snprintf(buf + used, cap - used, "%s%s", used ? ", " : "", label);
            used += n > 0 && (size_t)n < cap - used ? (size_t)n : 0;
        }
    }
    return buf;
}

/* One option of a help text: the flag, then its description, default and variable. */
static void print_option(FILE *out, const cli_option_t *opt) {
    char flag[96];
    flag_text(opt, flag, sizeof flag);
    fprintf(out, "  %s", flag);
    size_t col = 2 + strlen(flag);
    if (col + 2 > HELP_COL) {
        fprintf(out, "\n%*s", HELP_COL, "");
    } else {
        fprintf(out, "%*s", (int)(HELP_COL - col), "");
    }
    char extra[256] = "";
    const char *def = cli_option_default(opt);
    const char *env = cli_option_env(opt);
    if (def || env) {
        snprintf(extra, sizeof extra, "(%s%s%s%s%s)", def ? "default " : "",
                 def ? def : "", def && env ? "; " : "", env ? "env " : "",
                 env ? env : "");
    }
    wrap(out, opt->help, HELP_COL, HELP_COL);
    if (extra[0]) {
        fprintf(out, "\n%*s", HELP_COL, "");
        wrap(out, extra, HELP_COL, HELP_COL);
    }
    fputc('\n', out);
}

/* " [--timeout DURATION] [--hold RESOURCE]..." for the options of cmd that the
 * positional synopsis does not already name. */
static void synopsis_options(const cli_command_t *c, char *buf, size_t cap) {
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < cli_n_options; i++) {
        const cli_option_t *opt = &cli_options[i];
        char needle[64];
        snprintf(needle, sizeof needle, "--%s", opt->name);
        if (!cli_option_listed(opt, c->cmd) || strstr(c->args, needle)) {
            continue;
        }
        int n = snprintf(buf + used, cap - used, " [--%s%s%s]%s", opt->name,
                         opt->metavar ? " " : "", opt->metavar ? opt->metavar : "",
                         (opt->flags & CLI_REPEAT) ? "..." : "");
        if (n < 0 || (size_t)n >= cap - used) {
            break;
        }
        used += (size_t)n;
    }
}

static void print_synopsis(FILE *out, const char *lead, const cli_command_t *c) {
    char line[512], opts[384];
    synopsis_options(c, opts, sizeof opts);
    snprintf(line, sizeof line, "%s%s%s%s%s%s", c->name, c->action ? " " : "",
             c->action ? c->action : "", c->args[0] ? " " : "", c->args, opts);
    fputs(lead, out);
    wrap(out, line, strlen(lead), strlen(lead) + 4);
    fputc('\n', out);
}

void cli_help_top(FILE *out) {
    fputs("usage: lapse [OPTION]... COMMAND [ARG]... [OPTION]...\n", out);
    wrap(out, cli_help_about, 0, 0);
    fputs("\n\ncommands:\n", out);
    for (size_t i = 0; i < cli_n_commands; i++) {
        print_synopsis(out, "  ", &cli_commands[i]);
        fprintf(out, "%*s", 6, "");
        wrap(out, cli_commands[i].summary, 6, 6);
        fputc('\n', out);
    }
    fputs("\nglobal options (before or after the command; a flag beats its variable):\n",
          out);
    for (size_t i = 0; i < cli_n_options; i++) {
        if (cli_option_shown(&cli_options[i]) && cli_options[i].commands == CLI_GLOBAL) {
            print_option(out, &cli_options[i]);
        }
    }
    fputs("\nenvironment (each sets what its option sets; an empty variable counts as "
          "unset):\n",
          out);
    for (size_t i = 0; i < cli_n_options; i++) {
        const cli_option_t *opt = &cli_options[i];
        const char *env = cli_option_env(opt);
        if (!cli_option_shown(opt) || !env) {
            continue;
        }
        char flag[64];
        snprintf(flag, sizeof flag, "--%s", opt->name);
        char used_by[160];
        fprintf(out, "  %-20s %-16s %s\n", env, flag,
                cli_option_commands(opt, used_by, sizeof used_by));
    }
    fputc('\n', out);
    char codes[256];
    snprintf(codes, sizeof codes, "exit codes: %s", cli_help_exit_codes);
    wrap(out, codes, 0, 2);
    fputs("\nRun 'lapse help COMMAND' (or 'lapse COMMAND --help') for a command's "
          "options.\n",
          out);
}

static void print_globals_line(FILE *out) {
    char line[512] = "global options (see 'lapse --help'):";
    size_t used = strlen(line);
    for (size_t i = 0; i < cli_n_options; i++) {
        const cli_option_t *opt = &cli_options[i];
        if (!cli_option_shown(opt) || opt->commands != CLI_GLOBAL ||
            opt->id == CLI_OPT_HELP) {
            continue;
        }
        char flag[96];
        flag_text(opt, flag, sizeof flag);
        int n = snprintf(line + used, sizeof line - used, "%s %s",
                         used > 36 && line[used - 1] != ':' ? "," : "", flag);
        if (n > 0 && (size_t)n < sizeof line - used) {
            used += (size_t)n;
        }
    }
    wrap(out, line, 0, 2);
    fputc('\n', out);
}

void cli_help_command(FILE *out, const cli_command_t *c) {
    print_synopsis(out, "usage: lapse ", c);
    wrap(out, c->about, 0, 0);
    fputs("\n\noptions:\n", out);
    const cli_option_t *help = NULL;
    for (size_t i = 0; i < cli_n_options; i++) {
        const cli_option_t *opt = &cli_options[i];
        if (opt->id == CLI_OPT_HELP) {
            help = opt;
        }
        if (cli_option_listed(opt, c->cmd)) {
            print_option(out, opt);
        }
    }
    if (help) {
        print_option(out, help);
    }
    fputc('\n', out);
    print_globals_line(out);
}

void cli_help_group(FILE *out, const char *name) {
    const char *lead = "usage: lapse ";
    for (size_t i = 0; i < cli_n_commands; i++) {
        if (strcmp(cli_commands[i].name, name) == 0) {
            print_synopsis(out, lead, &cli_commands[i]);
            lead = "       lapse ";
        }
    }
    for (size_t i = 0; i < cli_n_commands; i++) {
        if (strcmp(cli_commands[i].name, name) == 0) {
            fprintf(out, "  %-8s ", cli_commands[i].action);
            wrap(out, cli_commands[i].summary, 11, 11);
            fputc('\n', out);
        }
    }
    fprintf(out, "Run 'lapse %s ACTION --help' for an action's options.\n", name);
}

/* Text for a Markdown table cell: '|' would end the cell. */
static void md_cell(FILE *out, const char *text) {
    for (const char *p = text; *p; p++) {
        if (*p == '|') {
            fputc('\\', out);
        }
        fputc(*p, out);
    }
}

static void md_row(FILE *out, const cli_option_t *opt) {
    fputs("| ", out);
    if (opt->short_name) {
        fprintf(out, "`-%c`, ", opt->short_name);
    }
    fputs("`--", out);
    md_cell(out, opt->name);
    if (opt->metavar) {
        fputc(' ', out);
        md_cell(out, opt->metavar);
    }
    fputs("` | ", out);
    const char *env = cli_option_env(opt);
    if (env) {
        fprintf(out, "`%s`", env);
    }
    fputs(" | ", out);
    const char *def = cli_option_default(opt);
    if (def) {
        fputc('`', out);
        md_cell(out, def);
        fputc('`', out);
    }
    fputs(" | ", out);
    md_cell(out, opt->help);
    fputs(" |\n", out);
}

static const char md_head[] = "| option | environment | default | meaning |\n"
                              "| --- | --- | --- | --- |\n";

void cli_help_markdown(FILE *out) {
    fputs("<!-- options:begin (generated by `lapse help --markdown` from "
          "src/cli/options.c; a test keeps this block equal to it) -->\n",
          out);
    fputs("Global options, accepted before or after any command; a flag beats its "
          "environment variable, and an empty variable counts as unset:\n\n",
          out);
    fputs(md_head, out);
    for (size_t i = 0; i < cli_n_options; i++) {
        if (cli_option_shown(&cli_options[i]) && cli_options[i].commands == CLI_GLOBAL) {
            md_row(out, &cli_options[i]);
        }
    }
    for (size_t i = 0; i < cli_n_commands; i++) {
        const cli_command_t *c = &cli_commands[i];
        fprintf(out, "\n#### `lapse %s%s%s%s%s`\n\n", c->name, c->action ? " " : "",
                c->action ? c->action : "", c->args[0] ? " " : "", c->args);
        fprintf(out, "%s\n", c->about);
        bool any = false;
        for (size_t k = 0; k < cli_n_options; k++) {
            const cli_option_t *opt = &cli_options[k];
            if (!cli_option_listed(opt, c->cmd)) {
                continue;
            }
            if (!any) {
                fprintf(out, "\n%s", md_head);
                any = true;
            }
            md_row(out, opt);
        }
    }
    fputs("<!-- options:end -->\n", out);
}
