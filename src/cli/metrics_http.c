/* SPDX-License-Identifier: MIT
 * consume --metrics-listen: libmicrohttpd serves GET /metrics (the registry rendered by
 * src/metrics.c) and GET /healthz on its own thread. The listening socket is opened
 * here, so that a port in use or a host that does not resolve is one clear line and
 * exit 1 before the consumer starts, and so that port 0 logs the port it got.
 * libmicrohttpd (and the GnuTLS it brings) is loaded only here, when --metrics-listen
 * is given (src/dynlib.c). */
#include "metrics_http.h"

#include "config_int.h"
#include "dynlib_int.h"

#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define CLI_MHD_SYMS(X, a)                                                               \
    X(a, MHD_add_response_header)                                                        \
    X(a, MHD_create_response_from_buffer)                                                \
    X(a, MHD_destroy_response)                                                           \
    X(a, MHD_queue_response)                                                             \
    X(a, MHD_start_daemon)                                                               \
    X(a, MHD_stop_daemon)

static struct { CLI_MHD_SYMS(LAPSE__DYNSYM_FIELD, _) } mhd;

static const lapse__dynsym_t mhd_syms[] = {CLI_MHD_SYMS(LAPSE__DYNSYM_ENTRY, mhd)};

static lapse__dynlib_t libmicrohttpd =
    LAPSE__DYNLIB_INIT(LAPSE_LIBMICROHTTPD_SONAME, mhd_syms);

struct cli_metrics {
    lapse__metrics_t *registry;
    struct MHD_Daemon *daemon;
};

static enum MHD_Result reply(struct MHD_Connection *conn, unsigned status, char *body,
                             size_t len, const char *type) {
    /* body is malloc'd; the response frees it. */
    struct MHD_Response *resp =
        mhd.MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (resp == NULL) {
        free(body);
        return MHD_NO;
    }
    mhd.MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    mhd.MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    if (status == MHD_HTTP_METHOD_NOT_ALLOWED) {
        mhd.MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    }
    enum MHD_Result ret = mhd.MHD_queue_response(conn, status, resp);
    mhd.MHD_destroy_response(resp);
    return ret;
}

static enum MHD_Result reply_text(struct MHD_Connection *conn, unsigned status,
                                  const char *text) {
    size_t len = strlen(text);
    char *body = malloc(len + 1);
    if (body == NULL) {
        return MHD_NO;
    }
    memcpy(body, text, len + 1);
    return reply(conn, status, body, len, "text/plain; charset=utf-8");
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **req_cls) {
    (void)version;
    (void)upload_data;
    cli_metrics_t *metrics = cls;
    /* The first call only announces the request (headers read); answer on the next,
     * after any body was read and thrown away. */
    if (*req_cls == NULL) {
        *req_cls = metrics;
        return MHD_YES;
    }
    if (*upload_data_size != 0) {
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 &&
        strcmp(method, MHD_HTTP_METHOD_HEAD) != 0) {
        return reply_text(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET and HEAD\n");
    }
    if (strcmp(url, "/metrics") == 0) {
        lapse__metrics_values_t snap;
        lapse__metrics_snapshot(metrics->registry, &snap);
        char *body = NULL;
        size_t len = 0;
        FILE *out = open_memstream(&body, &len);
        if (out == NULL) {
            return MHD_NO;
        }
        lapse__metrics_render(&snap, out);
        if (fclose(out) != 0) {
            free(body);
            return MHD_NO;
        }
        return reply(conn, MHD_HTTP_OK, body, len,
                     "text/plain; version=0.0.4; charset=utf-8");
    }
    if (strcmp(url, "/healthz") == 0) {
        char why[400];
        bool ok = lapse__metrics_health(metrics->registry, why, sizeof why - 1);
        strcat(why, "\n");
        return reply_text(conn, ok ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE, why);
    }
    return reply_text(conn, MHD_HTTP_NOT_FOUND, "not found: try /metrics or /healthz\n");
}

/* The address the socket is bound to, as HOST:PORT ([V6]:PORT). */
static void bound_name(int fd, char *buf, size_t cap) {
    struct sockaddr_storage sa;
    socklen_t len = sizeof sa;
    char host[NI_MAXHOST] = "?", port[NI_MAXSERV] = "?";
    if (getsockname(fd, (struct sockaddr *)&sa, &len) == 0) {
        getnameinfo((struct sockaddr *)&sa, len, host, sizeof host, port, sizeof port,
                    NI_NUMERICHOST | NI_NUMERICSERV);
    }
    bool v6 = sa.ss_family == AF_INET6;
    snprintf(buf, cap, "%s%s%s:%s", v6 ? "[" : "", host, v6 ? "]" : "", port);
}

/* A listening socket on HOST:PORT; -1 after saying why. ":PORT" is every interface:
 * IPv6 with IPv4 mapped when the host has IPv6, else IPv4. */
static int listen_on(const char *listen_text, int *family) {
    char host[256], port[8];
    if (!lapse__metrics_listen_parse(listen_text, host, sizeof host, port, sizeof port)) {
        cli_errorf("metrics: \"%s\" is not HOST:PORT", listen_text);
        return -1;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    int gai = getaddrinfo(host[0] ? host : NULL, port, &hints, &res);
    if (gai != 0) {
        cli_errorf("metrics: cannot resolve %s: %s", listen_text, gai_strerror(gai));
        return -1;
    }
    int fd = -1, saved = 0;
    /* Every interface: prefer the IPv6 wildcard, which also takes IPv4. */
    for (int pass = 0; pass < 2 && fd < 0; pass++) {
        for (struct addrinfo *ai = res; ai != NULL && fd < 0; ai = ai->ai_next) {
            if (!host[0] && (pass == 0) != (ai->ai_family == AF_INET6)) {
                continue;
            }
            if (host[0] && pass == 1) {
                break;
            }
            fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
            if (fd < 0) {
                saved = errno;
                continue;
            }
            int one = 1, zero = 0;
            setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
            if (ai->ai_family == AF_INET6 && !host[0]) {
                setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
            }
            if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 64) != 0) {
                saved = errno;
                close(fd);
                fd = -1;
                continue;
            }
            *family = ai->ai_family;
        }
    }
    freeaddrinfo(res);
    if (fd < 0) {
        cli_errorf("metrics: cannot listen on %s: %s", listen_text, strerror(saved));
    }
    return fd;
}

cli_metrics_t *cli_metrics_start(cli_t *cli, int *code) {
    const char *listen_text = lapse_config_get(cli->cfg, "metrics_listen");
    if (listen_text == NULL || listen_text[0] == '\0') {
        return NULL;
    }
    lapse_error_t err = {0};
    if (lapse__dynlib_load(&libmicrohttpd, LAPSE_ERR_IO, &err) != LAPSE_OK) {
        cli_errorf("metrics: %s", err.text);
        *code = CLI_EXIT_FAILED;
        return NULL;
    }
    int family = AF_INET;
    int fd = listen_on(listen_text, &family);
    if (fd < 0) {
        *code = CLI_EXIT_FAILED;
        return NULL;
    }
    cli_metrics_t *metrics = calloc(1, sizeof *metrics);
    if (metrics != NULL) {
        metrics->registry = lapse__metrics_new(lapse_config_get(cli->cfg, "prefix"));
    }
    if (metrics == NULL || metrics->registry == NULL) {
        close(fd);
        cli_metrics_stop(metrics);
        cli_errorf("metrics: out of memory");
        *code = CLI_EXIT_FAILED;
        return NULL;
    }
    /* One thread polls the socket and answers; a scrape is a snapshot copy and a few
     * KB of text, so one thread is plenty. Connections idle for 10 s are closed. */
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO |
                     (family == AF_INET6 ? MHD_USE_IPv6 : 0);
    metrics->daemon = mhd.MHD_start_daemon(
        flags, 0, NULL, NULL, on_request, metrics, MHD_OPTION_LISTEN_SOCKET,
        (MHD_socket)fd, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)64, MHD_OPTION_END);
    char name[320];
    bound_name(fd, name, sizeof name);
    if (metrics->daemon == NULL) {
        close(fd);
        cli_metrics_stop(metrics);
        cli_errorf("metrics: cannot serve on %s (libmicrohttpd failed to start)", name);
        *code = CLI_EXIT_FAILED;
        return NULL;
    }
    lapse__log(cli->cfg, LAPSE_LOG_INFO,
               "event=metrics_listening address=%s paths=/metrics,/healthz", name);
    return metrics;
}

lapse__metrics_t *cli_metrics_registry(cli_metrics_t *metrics) {
    return metrics != NULL ? metrics->registry : NULL;
}

void cli_metrics_stop(cli_metrics_t *metrics) {
    if (metrics == NULL) {
        return;
    }
    if (metrics->daemon != NULL) {
        /* Joins the server's thread; it closes the listening socket it was given. */
        mhd.MHD_stop_daemon(metrics->daemon);
    }
    lapse__metrics_free(metrics->registry);
    free(metrics);
}
