/* SPDX-License-Identifier: MIT
 * The three RabbitMQ roles lapse needs (publisher, consumer, operator), each with the
 * narrowest permissions that work, as one table; exported as definitions with
 * passwordless users, so no password hash is ever written anywhere. README "Permissions"
 * says why each pattern is what it is; integration_least_privilege runs each role with
 * exactly these. */
#include "config_int.h"

#include <lapse/topology.h>

#include <jansson.h>
#include <stdio.h>
#include <string.h>

/* In each pattern every '@' stands for the prefix, whose alphabet, [A-Za-z0-9_-], needs
 * no escaping in a regular expression. */
typedef struct role_def {
    const char *role;
    const char *tag; /* "management": the UI for the operator; "" none */
    const char *configure, *write, *read;
} role_def_t;

static const role_def_t ROLES[] = {
    {"publisher", "", "^$", "^@\\.(hold|delay\\.\\d\\d)$", "^$"},
    {"consumer", "", "^(@\\.probe|amq\\.gen-.*)$",
     "^(@\\.(parked|events|delay\\.\\d\\d|probe)|amq\\.gen-.*)$",
     "^(@\\.(expired|probe)|amq\\.gen-.*)$"},
    {"operator", "management", "^@\\.", "^@\\.", "^@\\."},
};

static json_t *pattern(const char *pat, const char *prefix) {
    char buf[3 * LAPSE__PREFIX_MAX + 128];
    size_t n = 0, plen = strlen(prefix);
    for (const char *c = pat; *c && n + plen < sizeof buf; c++) {
        if (*c == '@') {
            memcpy(buf + n, prefix, plen);
            n += plen;
        } else {
            buf[n++] = *c;
        }
    }
    buf[n] = '\0';
    return json_string(buf);
}

char *lapse_roles_export(const lapse_config_t *cfg) {
    const char *prefix = lapse_config_get(cfg, "prefix");
    json_t *users = json_array();
    json_t *perms = json_array();
    for (size_t i = 0; i < sizeof ROLES / sizeof ROLES[0]; i++) {
        const role_def_t *r = &ROLES[i];
        char name[LAPSE__PREFIX_MAX + 16];
        snprintf(name, sizeof name, "%s-%s", prefix, r->role);
        json_t *tags = json_array();
        if (r->tag[0]) {
            json_array_append_new(tags, json_string(r->tag));
        }
        /* An empty hash: the user exists, with its permissions, and cannot log in until
         * `rabbitmqctl change_password` gives it a password. */
        json_array_append_new(users,
                              json_pack("{s:s, s:s, s:s, s:o}", "name", name,
                                        "password_hash", "", "hashing_algorithm",
                                        "rabbit_password_hashing_sha256", "tags", tags));
        json_array_append_new(perms, json_pack("{s:s, s:s, s:o, s:o, s:o}", "user", name,
                                               "vhost", "/", "configure",
                                               pattern(r->configure, prefix), "write",
                                               pattern(r->write, prefix), "read",
                                               pattern(r->read, prefix)));
    }
    json_t *root = json_pack("{s:o, s:o}", "users", users, "permissions", perms);
    char *text = root ? json_dumps(root, JSON_INDENT(2)) : NULL;
    json_decref(root);
    return text;
}
