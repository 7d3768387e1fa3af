/* SPDX-License-Identifier: MIT
 * lapse health: ask a running consumer's GET /healthz (consume --metrics-listen), for
 * scripts and container health checks. The request is one fixed line of HTTP/1.0 and
 * the answer's status line and first body line are all it reads, so a plain socket
 * with a deadline is enough here; the server side is libmicrohttpd. */
#include "cli.h"

#include "config_int.h"
#include "metrics_int.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define HEALTH_TIMEOUT_MS 5000

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Wait until fd is ready for events or the deadline passes; false on timeout (errno
 * ETIMEDOUT) or a failed poll. */
static bool wait_for(int fd, short events, int64_t deadline) {
    for (;;) {
        int64_t left = deadline - now_ms();
        if (left <= 0) {
            errno = ETIMEDOUT;
            return false;
        }
        struct pollfd p = {.fd = fd, .events = events};
        int n = poll(&p, 1, (int)left);
        if (n > 0) {
            return true;
        }
        if (n < 0 && errno != EINTR) {
            return false;
        }
    }
}

/* A non-blocking socket connected to host:port by the deadline, or -1 with errno. */
static int connect_to(const char *host, const char *port, int64_t deadline) {
    struct addrinfo hints = {
        .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    if (getaddrinfo(host, port, &hints, &res) != 0) {
        errno = EHOSTUNREACH;
        return -1;
    }
    int fd = -1, saved = ECONNREFUSED;
    for (struct addrinfo *ai = res; ai != NULL && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                    ai->ai_protocol);
        if (fd < 0) {
            saved = errno;
            continue;
        }
        int err = 0;
        socklen_t len = sizeof err;
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
            err = errno;
            if (err == EINPROGRESS) {
                err = wait_for(fd, POLLOUT, deadline) &&
                              getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0
                          ? err
                          : errno;
            }
        }
        if (err != 0) {
            saved = err;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    errno = saved;
    return fd;
}

/* Send the request and read the whole answer (at most cap-1 bytes) by the deadline. */
static bool exchange(int fd, const char *request, char *answer, size_t cap,
                     int64_t deadline) {
    size_t sent = 0, want = strlen(request);
    while (sent < want) {
        ssize_t n = send(fd, request + sent, want - sent, MSG_NOSIGNAL);
        if (n > 0) {
            sent += (size_t)n;
        } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
            return false;
        } else if (!wait_for(fd, POLLOUT, deadline)) {
            return false;
        }
    }
    size_t got = 0;
    for (;;) {
        ssize_t n = recv(fd, answer + got, cap - 1 - got, 0);
        if (n > 0) {
            got += (size_t)n;
            if (got == cap - 1) {
                break;
            }
        } else if (n == 0) {
            break;
        } else if (errno != EAGAIN && errno != EINTR) {
            return false;
        } else if (!wait_for(fd, POLLIN, deadline)) {
            return false;
        }
    }
    answer[got] = '\0';
    return true;
}

int cmd_health(cli_t *cli, int argc, char **argv) {
    if (argc != 0) {
        return cli_usage_error("health", "unexpected argument '%s'", argv[0]);
    }
    const char *listen_text = lapse_config_get(cli->cfg, "metrics_listen");
    char host[256], port[8];
    if (listen_text == NULL || listen_text[0] == '\0') {
        return cli_usage_error("health", "no consumer address: give --metrics-listen "
                                         "HOST:PORT or set LAPSE_METRICS_LISTEN");
    }
    /* The setting was checked when it was set. */
    lapse__metrics_listen_parse(listen_text, host, sizeof host, port, sizeof port);
    /* A listener on every interface answers on the loopback address. */
    const char *target = host;
    if (host[0] == '\0' || strcmp(host, "0.0.0.0") == 0) {
        target = "127.0.0.1";
    } else if (strcmp(host, "::") == 0) {
        target = "::1";
    }
    int64_t deadline = now_ms() + HEALTH_TIMEOUT_MS;
    int fd = connect_to(target, port, deadline);
    char answer[4096];
    char request[512];
    snprintf(request, sizeof request,
             "GET /healthz HTTP/1.0\r\nHost: %s%s%s:%s\r\nUser-Agent: lapse/%s\r\n\r\n",
             strchr(target, ':') ? "[" : "", target, strchr(target, ':') ? "]" : "", port,
             LAPSE_VERSION);
    if (fd < 0 || !exchange(fd, request, answer, sizeof answer, deadline)) {
        int saved = errno;
        if (fd >= 0) {
            close(fd);
        }
        cli_say("health", "no consumer answers on %s (%s)", listen_text, strerror(saved));
        return CLI_EXIT_FAILED;
    }
    close(fd);
    int status = 0;
    char *body = strstr(answer, "\r\n\r\n");
    if (sscanf(answer, "HTTP/%*d.%*d %d", &status) != 1 || body == NULL) {
        cli_say("health", "%s answers something other than HTTP", listen_text);
        return CLI_EXIT_FAILED;
    }
    body += 4;
    body[strcspn(body, "\r\n")] = '\0';
    /* The reason comes from the network: one line, no control bytes. */
    char line[sizeof answer * 4];
    lapse__escape_ctl(body, line, sizeof line);
    if (status == 200) {
        printf("%s\n", line[0] ? line : "ok");
        return CLI_EXIT_OK;
    }
    cli_say("health", "unhealthy (HTTP %d): %s", status, line[0] ? line : "-");
    return CLI_EXIT_FAILED;
}
