/* SPDX-License-Identifier: MIT
 * The socket under a broker connection: TCP, or TLS for amqps:// with the peer's
 * certificate and host name verified (docs/design.md, "Connections"). rabbitmq-c owns the
 * TLS session; lapse configures its OpenSSL context, and records through two callbacks
 * why a handshake failed, which rabbitmq-c only reports as "SSL connection failed". */
#include "broker_int.h"

#include <amqp_ssl_socket.h>
#include <amqp_tcp_socket.h>
#include <errno.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* rabbitmq-c 0.11 loads no CA unless told, so without --tls-ca this bundle (Debian's
 * ca-certificates) is what a certificate is verified against. */
#define SYSTEM_CA_BUNDLE "/etc/ssl/certs/ca-certificates.crt"

struct lapse__tls {
    int verify_error; /* X509_V_ERR_* of the first certificate that failed, 0: none */
    char alert[64];   /* a fatal alert the broker sent, "" when none */
};

/* Called by OpenSSL for every certificate of the chain; keeps the first failure. With
 * SSL_VERIFY_PEER a failure (ok == 0, returned as is) ends the handshake. */
static int on_verify(int ok, X509_STORE_CTX *store) {
    if (ok) {
        return ok;
    }
    SSL *ssl = X509_STORE_CTX_get_ex_data(store, SSL_get_ex_data_X509_STORE_CTX_idx());
    lapse__tls_t *tls = ssl != NULL ? SSL_CTX_get_app_data(SSL_get_SSL_CTX(ssl)) : NULL;
    if (tls != NULL && tls->verify_error == 0) {
        tls->verify_error = X509_STORE_CTX_get_error(store);
    }
    return ok;
}

/* A fatal alert from the broker's side: it refused this client (no client certificate,
 * one it does not trust, no common protocol version). Under TLS 1.3 the refusal of a
 * client certificate arrives after the handshake, during the login. */
static void on_info(const SSL *ssl, int where, int ret) {
    if ((where & SSL_CB_READ_ALERT) == 0 || (ret >> 8) != SSL3_AL_FATAL) {
        return;
    }
    lapse__tls_t *tls = SSL_CTX_get_app_data(SSL_get_SSL_CTX(ssl));
    if (tls != NULL && tls->alert[0] == '\0') {
        /* OpenSSL 3.0 names no alert newer than TLS 1.2; 116 is TLS 1.3's. */
        int desc = ret & 0xff;
        const char *name =
            desc == 116 ? "certificate required" : SSL_alert_desc_string_long(ret);
        if (strcmp(name, "unknown") == 0) {
            snprintf(tls->alert, sizeof tls->alert, "TLS alert %d", desc);
        } else {
            snprintf(tls->alert, sizeof tls->alert, "%s", name);
        }
    }
}

/* An encrypted private key must fail to load, not ask for a passphrase on a terminal. */
static int no_passphrase(char *buf, int size, int rwflag, void *userdata) {
    (void)buf;
    (void)size;
    (void)rwflag;
    (void)userdata;
    return 0;
}

/* OpenSSL's reason for the last failure (its error queue, then emptied). */
static const char *openssl_reason(void) {
    unsigned long e = ERR_peek_last_error();
    const char *reason = e != 0 ? ERR_reason_error_string(e) : NULL;
    ERR_clear_error();
    return reason != NULL ? reason : "unknown error";
}

/* A file the TLS context needs: readable, or one clear line that says why not. */
static lapse_status_t check_file(const char *what, const char *path, lapse_error_t *err) {
    if (access(path, R_OK) != 0) {
        return lapse_error_set(err, LAPSE_ERR_BROKER_TLS, "TLS: %s %s: %s", what, path,
                               strerror(errno));
    }
    return LAPSE_OK;
}

static lapse_status_t configure(amqp_socket_t *socket, lapse__tls_t *tls,
                                const lapse_config_t *cfg, lapse_error_t *err) {
    SSL_CTX *ctx = amqp_ssl_socket_get_context(socket);
    if (ctx == NULL) {
        return lapse_error_set(err, LAPSE_ERR_BROKER_TLS, "TLS: no OpenSSL context");
    }
    SSL_CTX_set_app_data(ctx, tls);
    SSL_CTX_set_info_callback(ctx, on_info);
    SSL_CTX_set_default_passwd_cb(ctx, no_passphrase);

    const char *ca = cfg->tls_ca[0] != '\0' ? cfg->tls_ca : SYSTEM_CA_BUNDLE;
    lapse_status_t rc = check_file("CA file", ca, err);
    if (rc != LAPSE_OK) {
        return rc;
    }
    if (amqp_ssl_socket_set_cacert(socket, ca) != AMQP_STATUS_OK) {
        return lapse_error_set(err, LAPSE_ERR_BROKER_TLS, "TLS: CA file %s: %s", ca,
                               openssl_reason());
    }
    if (cfg->tls_cert[0] != '\0') {
        if ((rc = check_file("client certificate", cfg->tls_cert, err)) != LAPSE_OK ||
            (rc = check_file("client key", cfg->tls_key, err)) != LAPSE_OK) {
            return rc;
        }
        if (amqp_ssl_socket_set_key(socket, cfg->tls_cert, cfg->tls_key) !=
                AMQP_STATUS_OK ||
            SSL_CTX_check_private_key(ctx) != 1) {
            return lapse_error_set(err, LAPSE_ERR_BROKER_TLS,
                                   "TLS: client certificate %s with key %s: %s",
                                   cfg->tls_cert, cfg->tls_key, openssl_reason());
        }
    }

    /* OpenSSL checks the host name (or the IP address of a literal) as part of the
     * chain, so a mismatch ends the handshake with its own reason; rabbitmq-c's check
     * after the handshake knows no IP addresses and is turned off in its favour. */
    X509_VERIFY_PARAM *param = SSL_CTX_get0_param(ctx);
    X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
    if (X509_VERIFY_PARAM_set1_ip_asc(param, cfg->host) != 1 &&
        X509_VERIFY_PARAM_set1_host(param, cfg->host, 0) != 1) {
        return lapse_error_set(err, LAPSE_ERR_BROKER_TLS,
                               "TLS: cannot verify against the host name %s", cfg->host);
    }
    ERR_clear_error();
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, on_verify);
    amqp_ssl_socket_set_verify_peer(socket, 1);
    amqp_ssl_socket_set_verify_hostname(socket, 0);
    return LAPSE_OK;
}

lapse_status_t lapse__broker_socket_new(amqp_connection_state_t conn,
                                        const lapse_config_t *cfg, amqp_socket_t **socket,
                                        lapse__tls_t **tls, lapse_error_t *err) {
    *tls = NULL;
    lapse_status_t rc = lapse__config_check_tls(cfg, err);
    if (rc != LAPSE_OK) {
        return rc;
    }
    if (!cfg->tls) {
        *socket = amqp_tcp_socket_new(conn);
        return *socket != NULL ? LAPSE_OK
                               : lapse_error_set(err, LAPSE_ERR_NOMEM,
                                                 "cannot allocate an AMQP socket");
    }
    *tls = calloc(1, sizeof **tls);
    *socket = *tls != NULL ? amqp_ssl_socket_new(conn) : NULL;
    if (*socket == NULL) {
        return lapse_error_set(err, LAPSE_ERR_NOMEM, "cannot allocate a TLS socket");
    }
    return configure(*socket, *tls, cfg, err);
}

lapse_status_t lapse__broker_tls_failure(const lapse__tls_t *tls,
                                         const lapse_config_t *cfg, lapse_status_t rc,
                                         lapse_error_t *err) {
    if (tls == NULL) {
        return rc;
    }
    if (tls->verify_error != 0) {
        ERR_clear_error();
        /* "certificate verify failed" is how OpenSSL's own tools say it. */
        return lapse_error_set(
            err, LAPSE_ERR_BROKER_TLS, "TLS: certificate verify failed for %s:%d: %s",
            cfg->host, cfg->port, X509_verify_cert_error_string(tls->verify_error));
    }
    if (tls->alert[0] != '\0') {
        ERR_clear_error();
        return lapse_error_set(
            err, LAPSE_ERR_BROKER_TLS, "TLS: %s:%d refused this client: %s%s", cfg->host,
            cfg->port, tls->alert,
            cfg->tls_cert[0] == '\0' ? " (it sent none: see --tls-cert and --tls-key)"
                                     : "");
    }
    return rc;
}

const char *lapse__broker_tls_reason(void) {
    return openssl_reason();
}

void lapse__broker_tls_free(lapse__tls_t *tls) {
    free(tls);
}
