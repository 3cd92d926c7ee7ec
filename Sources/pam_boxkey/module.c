/* pam_boxkey: turns a phone's push into a normal PAM authentication. The module opens a prompt
 * with boxkeyd and asks for the password at once; Enter with nothing typed takes the phone's
 * push for this prompt, sets PAM_USER and PAM_AUTHTOK, and lets the next module (pam_unix
 * use_first_pass, pam_sss, ...) verify them; the stack's outcome goes back to the daemon
 * (pending.c), which tells the phone. Synchronous, and in C: it is loaded into every PAM
 * program, setuid su and sudo included (docs/architecture.md says why C). */
#define _GNU_SOURCE
#include "pending.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Marks a message for scripts/update-po (xgettext --keyword=tr); bk_say translates it. */
#define tr(msgid) msgid
#define SAY(out, msgid, ...) do { \
        const char *const pairs_[] = { __VA_ARGS__ }; \
        bk_say(out, sizeof out, msgid, pairs_, (int)(sizeof pairs_ / sizeof *pairs_) / 2); \
    } while (0)

/* Enters with nothing typed and no phone before the module leaves the prompt to the stack. */
enum { MAX_EMPTY_ENTERS = 5 };

static const char *const loopback_hosts[] = { "localhost", "localhost.localdomain", "127.0.0.1", "::1" };

static int is_loopback(const char *host) {
    for (size_t i = 0; i < sizeof loopback_hosts / sizeof *loopback_hosts; i++)
        if (strcmp(host, loopback_hosts[i]) == 0) return 1;
    return 0;
}

static const char *or_empty(const char *s) { return s ? s : ""; }

/* No phone here: step aside, having asked for the password when told to (ask_password). */
static int step_aside(pam_handle_t *pamh, const struct bk_options *o) {
    if (o->ask_password) {
        const char *token = NULL;
        int rc = pam_get_authtok(pamh, PAM_AUTHTOK, &token, NULL);
        if (rc != PAM_SUCCESS && o->debug) pam_syslog(pamh, LOG_DEBUG, "asking for the password: %s", pam_strerror(pamh, rc));
    }
    return bk_unavailable_code(o);
}

static void send_cancel(struct bk_client *c) {
    struct bk_frame f;
    bk_encode_cancel(&f);
    bk_client_send(c, &f);
}

static void send_rejected(struct bk_client *c, const char *reason) {
    struct bk_frame f;
    bk_encode_report_outcome(&f, BK_REJECTED, reason);
    bk_client_send(c, &f);
}

/* `answer_prompt` after a typed password: the next module's hidden prompt is answered with
 * it, until authentication ends (a pending login that tells the daemon nothing). */
static void keep_typed(pam_handle_t *pamh, const char *password, int debug) {
    struct bk_pending *p = bk_pending_new(pamh, NULL, "", debug);
    if (!p) return;
    if (!(p->answer = bk_prompt_answer_install(pamh, password, 1))) { free(p); return; }
    bk_pending_keep(p);
}

/* Takes `user` as the login's PAM_USER unless the prompt is for someone else (a locker).
 * 0: claimed; else what to return (-1: step aside to the password prompt). */
static int claim(pam_handle_t *pamh, struct bk_client *c, const char *user, const char *expected, const char *what) {
    if (*expected && strcmp(expected, user) != 0) {
        pam_syslog(pamh, LOG_NOTICE, "refusing a %s for another user: this prompt is for %s", what, expected);
        send_rejected(c, "this prompt is for another user");
        return -1;
    }
    if (pam_set_item(pamh, PAM_USER, user) != PAM_SUCCESS) {
        send_rejected(c, "the login stack failed");
        return PAM_SYSTEM_ERR;
    }
    return 0;
}

/* A pushed password: PAM_USER and PAM_AUTHTOK for the verifier after this module. -1:
 * refused, step aside to the password prompt. */
static int password_push(pam_handle_t *pamh, struct bk_client *c, struct bk_reply *r, const char *expected, const struct bk_options *o) {
    const char *user = r->text[0], *password = (const char *)r->secret;
    int claimed = claim(pamh, c, user, expected, "push");
    if (claimed) return claimed;
    if (pam_set_item(pamh, PAM_AUTHTOK, password) != PAM_SUCCESS) {
        send_rejected(c, "the login stack failed");
        return PAM_SYSTEM_ERR;
    }
    struct bk_pending *p = bk_pending_new(pamh, c, r->text[1], o->debug);
    if (!p) return PAM_BUF_ERR;
    p->answer = bk_prompt_answer_install(pamh, password, o->answer_prompt);
    if (!bk_pending_keep(p)) return PAM_SYSTEM_ERR;
    pam_syslog(pamh, LOG_INFO, "credentials received from a phone");
    /* PAM_IGNORE, not PAM_SUCCESS: only the verifier after this module decides, whatever the
     * control lines around it say (with success=ok, a verifier whose failure the stack
     * ignores would have let any pushed password in). */
    return PAM_IGNORE;
}

/* Key mode: the daemon vouches that an enrolled phone asked, with its person's intent, to
 * log `user` in here. -1: refused, step aside to the password prompt. */
static int key_login(pam_handle_t *pamh, struct bk_client *c, struct bk_reply *r, const char *expected, const struct bk_options *o) {
    if (!o->key_logins) {
        pam_syslog(pamh, LOG_NOTICE, "refusing a key login: this stack line has no `key` option");
        send_rejected(c, "this login stack does not take key logins");
        return -1;
    }
    int claimed = claim(pamh, c, r->text[0], expected, "key login");
    if (claimed) return claimed;
    struct bk_pending *p = bk_pending_new(pamh, c, r->text[1], o->debug);
    if (!p) return PAM_BUF_ERR;
    if (!bk_pending_keep(p)) return PAM_SYSTEM_ERR;
    pam_syslog(pamh, LOG_INFO, "key login from an enrolled phone for %s", r->text[0]);
    return PAM_SUCCESS;
}

/* Escrow mode, no sealed copy yet: the person types the password once, with the phone
 * present; it goes on to the stack, and on success to the daemon to seal. -1: step aside. */
static int escrow_capture(pam_handle_t *pamh, struct bk_client *c, struct bk_reply *r, const char *expected, const struct bk_options *o) {
    const char *user = r->text[0];
    int claimed = claim(pamh, c, user, expected, "escrow capture");
    if (claimed) return claimed;
    char line[1024];
    SAY(line, tr("{user}'s phone is here: type the password once, and the box keeps it sealed for that phone"), "user", user);
    bk_info(pamh, line);
    const char *token = NULL;
    if (pam_get_authtok(pamh, PAM_AUTHTOK, &token, NULL) != PAM_SUCCESS || !token || !*token) {
        send_rejected(c, "no password was typed");
        return -1;
    }
    char *captured = strdup(token);
    struct bk_pending *p = captured ? bk_pending_new(pamh, c, r->text[1], o->debug) : NULL;
    if (!p) { bk_free_secret(captured); return PAM_BUF_ERR; }
    p->captured = captured;
    p->answer = bk_prompt_answer_install(pamh, p->captured, o->answer_prompt);
    if (!bk_pending_keep(p)) return PAM_SYSTEM_ERR;
    pam_syslog(pamh, LOG_INFO, "escrow capture for %s: the typed password goes to the stack", user);
    return PAM_IGNORE; /* as after a push: the verifier after this module decides */
}

/* Enter with nothing typed: the phone's push for this prompt, if one comes. 1: ask again;
 * `pairing` then holds the line of a new pairing code, if the box made one (empty: none). */
static int take_push(pam_handle_t *pamh, struct bk_client *c, const char *user, const struct bk_options *o, int *result,
                     char *pairing, size_t pairing_size) {
    struct bk_reply r;
    struct bk_frame f;
    struct bk_quiet_terminal terminal;
    bk_quiet_terminal_begin(&terminal, bk_item(pamh, PAM_TTY));
    bk_encode_intent(&f);
    enum bk_client_error e = bk_client_send(c, &f);
    int64_t wait_ms = (int64_t)(o->timeout_seconds + 1) * 1000;
    if (e == BK_CLIENT_OK) e = bk_client_receive(c, wait_ms < BK_QUIET_WAIT_MAX_MS ? wait_ms : BK_QUIET_WAIT_MAX_MS, &r);
    int pushed = e == BK_CLIENT_OK && (r.kind == BK_PUSH || r.kind == BK_KEY_LOGIN || r.kind == BK_ESCROW_CAPTURE);
    bk_quiet_terminal_end(&terminal, pushed);
    if (e != BK_CLIENT_OK) {
        if (o->debug) pam_syslog(pamh, LOG_DEBUG, "boxkeyd: %s", bk_client_error_text(c, e));
        *result = step_aside(pamh, o);
        return 0;
    }
    int rc;
    switch (r.kind) {
    case BK_NOTHING_YET_NEW_CODE: {
        char minutes[16];
        snprintf(minutes, sizeof minutes, "%llu", r.number < 60 ? 1ULL : ((unsigned long long)r.number + 59) / 60);
        const char *const pairs[] = { "code", r.text[0], "minutes", minutes };
        bk_say(pairing, pairing_size, tr("New pairing code {code} (valid {minutes} min): the one above is used up"), pairs, 2);
        bk_reply_wipe(&r);
        return 1;
    }
    case BK_NO_PUSH:
        if (r.number == BK_NOTHING_YET || r.number == BK_TIMED_OUT) return 1;
        if (o->debug) pam_syslog(pamh, LOG_DEBUG, "no push: %u", r.number);
        *result = step_aside(pamh, o);
        return 0;
    case BK_PUSH: rc = password_push(pamh, c, &r, user, o); break;
    case BK_KEY_LOGIN: rc = key_login(pamh, c, &r, user, o); break;
    case BK_ESCROW_CAPTURE: rc = escrow_capture(pamh, c, &r, user, o); break;
    default: send_cancel(c); rc = -1; break;
    }
    bk_reply_wipe(&r);
    *result = rc < 0 ? step_aside(pamh, o) : rc;
    return 0;
}

/* The prompt with the daemon open: asks for the password, and takes a phone's push when
 * Enter is pressed with nothing typed. */
static int converse_with_daemon(pam_handle_t *pamh, struct bk_client *c, const char *user, const char *box, const struct bk_options *o) {
    char pairing[512] = "";
    for (int attempt = 0; attempt < MAX_EMPTY_ENTERS; attempt++) {
        if (attempt > 0) {
            char line[1024];
            SAY(line, tr("No phone has pushed to box {box} yet: push, then Enter, or type the password"), "box", box);
            if (pairing[0]) {
                size_t used = strlen(line);
                snprintf(line + used, sizeof line - used, "\n%s", pairing);
                pairing[0] = 0;
            }
            bk_info(pamh, line);
        }
        /* The application's own words for the password: Linux-PAM's, in its locale. */
        char *answer = bk_ask(pamh, PAM_PROMPT_ECHO_OFF, bk_foreign("Linux-PAM", "Password: "));
        if (!answer) {
            /* Cancelled (Ctrl-D, the greeter's Cancel), or no conversation. */
            send_cancel(c);
            return PAM_CONV_ERR;
        }
        if (*answer) {
            /* The person's own password, handed on as typed; a push that waited is let go. */
            send_cancel(c);
            int rc = pam_set_item(pamh, PAM_AUTHTOK, answer);
            /* A verifier that always asks gets the same answer instead of asking twice. */
            if (rc == PAM_SUCCESS && o->answer_prompt) keep_typed(pamh, answer, o->debug);
            bk_free_secret(answer);
            return rc == PAM_SUCCESS ? bk_unavailable_code(o) : PAM_SYSTEM_ERR;
        }
        bk_free_secret(answer);
        int result;
        if (!take_push(pamh, c, user, o, &result, pairing, sizeof pairing)) return result;
    }
    /* A conversation that answers Enter every time (a program without a person): give up. */
    send_cancel(c);
    return step_aside(pamh, o);
}

/* Opens the prompt with the daemon; -1 when phone login is not offered here. */
static int offer(pam_handle_t *pamh, struct bk_client *c, const char *user, const char *remote_host, const struct bk_options *o) {
    struct bk_frame f;
    struct bk_reply r;
    enum bk_client_error e = bk_client_open(c, o->socket);
    if (e == BK_CLIENT_OK) {
        bk_encode_wait_for_push(&f, or_empty(bk_item(pamh, PAM_SERVICE)), or_empty(bk_item(pamh, PAM_TTY)),
                                or_empty(bk_item(pamh, PAM_XDISPLAY)), remote_host, user, (uint32_t)o->timeout_seconds * 1000);
        e = bk_client_send(c, &f);
    }
    /* Not offered (sudo, a remote session), or a daemon slower than this: step aside without
     * a word, so the password prompt comes at once. */
    /* No echo while it waits: a password typed ahead (a slow daemon, a fast typist) must not
     * show on the screen; what is typed stays in the terminal's buffer. */
    struct bk_quiet_terminal terminal;
    bk_quiet_terminal_begin(&terminal, bk_item(pamh, PAM_TTY));
    if (e == BK_CLIENT_OK) e = bk_client_receive(c, o->first_answer_ms, &r);
    bk_quiet_terminal_end(&terminal, 0);
    if (e != BK_CLIENT_OK) {
        if (o->debug) pam_syslog(pamh, LOG_DEBUG, "boxkeyd: %s", bk_client_error_text(c, e));
        return -1;
    }
    if (r.kind != BK_PROMPT) {
        if (r.kind == BK_NOT_OFFERED && o->debug) pam_syslog(pamh, LOG_DEBUG, "phone login not offered: %s", r.text[0]);
        return -1;
    }
    /* One message: greeters that show one at a time (lightdm-gtk-greeter) keep both lines. */
    char line[1024], pairing[512], minutes[16];
    SAY(line, tr("Box {box}: push from your phone, then press Enter (key {fingerprint})"), "box", r.text[0], "fingerprint", r.text[1]);
    if (r.text[2][0]) {
        snprintf(minutes, sizeof minutes, "%llu", r.number < 60 ? 1ULL : ((unsigned long long)r.number + 59) / 60);
        SAY(pairing, tr("New phone? Pairing code {code}: boxkey pair {box} (valid {minutes} min)"),
            "code", r.text[2], "box", r.text[0], "minutes", minutes);
        size_t used = strlen(line);
        snprintf(line + used, sizeof line - used, "\n%s", pairing);
    }
    bk_info(pamh, line);
    return converse_with_daemon(pamh, c, user, r.text[0], o);
}

BK_EXPORT int pam_sm_authenticate(pam_handle_t *pamh, int flags, int argc, const char **argv) {
    (void)flags;
    struct bk_options o;
    bk_options_parse(&o, pamh, argc, argv);
    /* A retry on the same handle (login asks again after "Login incorrect"): the earlier
     * attempt's pending login (or typed password) is reported as refused and its proxy goes. */
    pam_set_data(pamh, bk_pending_key, NULL, NULL);

    /* A module before this one already has the password (pam_krb5 ranks above pam_boxkey in
     * pam-auth-update): the person typed it, so asking again would only delay them. */
    const void *typed = NULL;
    if (pam_get_item(pamh, PAM_AUTHTOK, &typed) == PAM_SUCCESS && typed) {
        if (o.debug) pam_syslog(pamh, LOG_DEBUG, "a password is already set: not offering phone login");
        return bk_unavailable_code(&o);
    }
    /* A phone near the box cannot vouch for someone logging in over the network. A loopback
     * host goes to the daemon, which accepts it only when logind says the session is local. */
    const char *remote_host = or_empty(bk_item(pamh, PAM_RHOST));
    if (*remote_host && !is_loopback(remote_host)) {
        if (o.debug) pam_syslog(pamh, LOG_DEBUG, "remote session from %s: not offering phone login", remote_host);
        return step_aside(pamh, &o);
    }
    /* Nobody named yet (a greeter's "other user"): who, first, as the program would ask. A
     * prompt for nobody takes no push (Enter there would log in whoever's push waited). */
    /* A name longer than the wire carries would be cut, and could then match another's; so
     * could one that is not text the wire takes as is (a stray byte grows into U+FFFD, a
     * control character becomes a space): such a name gets no phone login, only the prompt. */
    char user[BK_MAX_TEXT + 1] = "";
    const char *named = or_empty(bk_item(pamh, PAM_USER));
    if (strlen(named) > BK_MAX_TEXT || !bk_valid_text((const uint8_t *)named, strlen(named))) return step_aside(pamh, &o);
    snprintf(user, sizeof user, "%s", or_empty(bk_item(pamh, PAM_USER)));
    for (int i = 0; i < MAX_EMPTY_ENTERS && !*user; i++) {
        char prompt[256];
        const char *asked = bk_item(pamh, PAM_USER_PROMPT);
        if (!asked) snprintf(prompt, sizeof prompt, "%s ", bk_foreign("Linux-PAM", "login:"));
        char *name = bk_ask(pamh, PAM_PROMPT_ECHO_ON, asked ? asked : prompt);
        if (!name) return PAM_CONV_ERR;
        int valid = strlen(name) <= BK_MAX_TEXT && bk_valid_text((const uint8_t *)name, strlen(name));
        if (*name && (!valid || pam_set_item(pamh, PAM_USER, name) != PAM_SUCCESS)) { bk_free_secret(name); return PAM_USER_UNKNOWN; }
        snprintf(user, sizeof user, "%s", name);
        bk_free_secret(name); /* a password typed at the wrong prompt is a secret too */
    }
    if (!*user) return PAM_CONV_ERR;

    struct bk_client c;
    int rc = offer(pamh, &c, user, remote_host, &o);
    bk_client_close(&c); /* unless a pending login took it */
    return rc < 0 ? step_aside(pamh, &o) : rc;
}

/* Reports success as soon as the application goes on to establish credentials (login,
 * greeters and lockers do that only after authentication and account checks passed). */
static void report_accepted(pam_handle_t *pamh) {
    struct bk_pending *p = bk_pending_find(pamh);
    if (p) bk_pending_report(p, 1, "");
}

BK_EXPORT int pam_sm_setcred(pam_handle_t *pamh, int flags, int argc, const char **argv) {
    (void)argc; (void)argv;
    if (flags & (PAM_ESTABLISH_CRED | PAM_REINITIALIZE_CRED | PAM_REFRESH_CRED)) report_accepted(pamh);
    return PAM_SUCCESS;
}

BK_EXPORT int pam_sm_acct_mgmt(pam_handle_t *pamh, int flags, int argc, const char **argv) {
    (void)pamh; (void)flags; (void)argc; (void)argv;
    return PAM_IGNORE; /* account policy belongs to the site's modules */
}

/* One request and its acknowledgement; a session never fails because the daemon is away. */
static void tell_daemon(pam_handle_t *pamh, const struct bk_options *o, struct bk_frame *f) {
    struct bk_client c;
    struct bk_reply r;
    enum bk_client_error e = bk_client_open(&c, o->socket);
    if (e == BK_CLIENT_OK) e = bk_client_send(&c, f);
    if (e == BK_CLIENT_OK) e = bk_client_receive(&c, 1000, &r);
    if (e != BK_CLIENT_OK && o->debug) pam_syslog(pamh, LOG_DEBUG, "boxkeyd: %s", bk_client_error_text(&c, e));
    bk_client_close(&c);
}

/* Tells the daemon which logind session the user now has, so walk-away acts on it. Only what
 * pam_systemd put in the PAM environment, never the process environment (the caller's to
 * set); the daemon still checks with logind whose session it is. */
BK_EXPORT int pam_sm_open_session(pam_handle_t *pamh, int flags, int argc, const char **argv) {
    (void)flags;
    struct bk_options o;
    report_accepted(pamh);
    bk_options_parse(&o, pamh, argc, argv);
    const char *session = pam_getenv(pamh, "XDG_SESSION_ID"), *user = bk_item(pamh, PAM_USER);
    if (!session || !*session || !user) {
        if (o.debug) pam_syslog(pamh, LOG_DEBUG, "no XDG_SESSION_ID in the PAM environment (is pam_systemd before pam_boxkey in the session stack?)");
        return PAM_SUCCESS;
    }
    struct bk_pending *p = bk_pending_find(pamh);
    struct bk_frame f;
    bk_encode_open_session(&f, user, session, or_empty(bk_item(pamh, PAM_SERVICE)), p ? p->ticket : "");
    tell_daemon(pamh, &o, &f);
    return PAM_SUCCESS;
}

BK_EXPORT int pam_sm_close_session(pam_handle_t *pamh, int flags, int argc, const char **argv) {
    (void)flags;
    struct bk_options o;
    bk_options_parse(&o, pamh, argc, argv);
    const char *session = pam_getenv(pamh, "XDG_SESSION_ID");
    if (session && *session) {
        struct bk_frame f;
        bk_encode_close_session(&f, session);
        tell_daemon(pamh, &o, &f);
    }
    return PAM_SUCCESS;
}
