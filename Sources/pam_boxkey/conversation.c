/* The module and the person: the application's conversation, the proxy put in front of it
 * once a password is at hand, the terminal's echo while a push is awaited, and the words,
 * in the application's locale (a module never sets the locale itself). */
#define _GNU_SOURCE
#include "module.h"

#include <libintl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *bk_item(pam_handle_t *pamh, int type) {
    const void *value = NULL;
    if (pam_get_item(pamh, type, &value) != PAM_SUCCESS || !value || !*(const char *)value) return NULL;
    return value;
}

void bk_free_secret(char *s) {
    if (!s) return;
    explicit_bzero(s, strlen(s));
    free(s);
}

/* One message through the application's conversation. The response, if any, is handed back
 * (the caller frees it), NULL when there is no conversation, it failed or gave none. */
static struct pam_response *converse(pam_handle_t *pamh, int style, const char *text) {
    const void *item = NULL;
    if (pam_get_item(pamh, PAM_CONV, &item) != PAM_SUCCESS || !item) return NULL;
    const struct pam_conv *conv = item;
    if (!conv->conv) return NULL;
    struct pam_message message = { .msg_style = style, .msg = text };
    const struct pam_message *list = &message;
    struct pam_response *response = NULL;
    if (conv->conv(1, &list, &response, conv->appdata_ptr) != PAM_SUCCESS) {
        if (response) { bk_free_secret(response->resp); free(response); }
        return NULL;
    }
    return response;
}

char *bk_ask(pam_handle_t *pamh, int style, const char *text) {
    struct pam_response *response = converse(pamh, style, text);
    if (!response) return NULL;
    char *answer = response->resp; /* NULL: no answer, never Enter */
    free(response);
    return answer;
}

void bk_info(pam_handle_t *pamh, const char *text) {
    struct pam_response *response = converse(pamh, PAM_TEXT_INFO, text);
    if (response) { bk_free_secret(response->resp); free(response); }
}

/* ---- The proxy conversation ---- */

static int proxy(int count, const struct pam_message **messages, struct pam_response **responses, void *data) {
    struct bk_prompt_answer *a = data;
    if (!a) return PAM_CONV_ERR;
    if (a->answer_first && count == 1 && messages && messages[0] && messages[0]->msg_style == PAM_PROMPT_ECHO_OFF
        && responses && a->password) {
        struct pam_response *r = calloc(1, sizeof *r);
        if (!r) return PAM_BUF_ERR;
        r->resp = a->password; /* PAM frees responses with free(): the password goes with it, once */
        a->password = NULL;
        *responses = r;
        return PAM_SUCCESS;
    }
    for (int i = 0; messages && i < count; i++)
        if (messages[i] && messages[i]->msg_style == PAM_PROMPT_ECHO_OFF) a->person_answered = 1;
    if (!a->original.conv) return PAM_CONV_ERR;
    return a->original.conv(count, messages, responses, a->original.appdata_ptr);
}

struct bk_prompt_answer *bk_prompt_answer_install(pam_handle_t *pamh, const char *password, int answer_first) {
    const void *item = NULL;
    if (pam_get_item(pamh, PAM_CONV, &item) != PAM_SUCCESS || !item) return NULL;
    struct pam_conv current = *(const struct pam_conv *)item;
    /* A retry on the same handle: wrap the application's conversation, not our own. */
    if (current.conv == proxy && current.appdata_ptr)
        current = ((struct bk_prompt_answer *)current.appdata_ptr)->original;
    struct bk_prompt_answer *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    a->original = current;
    a->answer_first = answer_first;
    if (answer_first && !(a->password = strdup(password))) { free(a); return NULL; }
    struct pam_conv mine = { .conv = proxy, .appdata_ptr = a };
    if (pam_set_item(pamh, PAM_CONV, &mine) != PAM_SUCCESS) { bk_prompt_answer_free(a); return NULL; }
    return a;
}

/* Only while the proxy is still the handle's conversation: an application that installed a
 * new one meanwhile (and perhaps freed the old one's data) keeps it. */
void bk_prompt_answer_uninstall(struct bk_prompt_answer *a, pam_handle_t *pamh) {
    const void *item = NULL;
    if (!a || !pamh || pam_get_item(pamh, PAM_CONV, &item) != PAM_SUCCESS || !item) return;
    const struct pam_conv *current = item;
    if (current->conv == proxy && current->appdata_ptr == a) pam_set_item(pamh, PAM_CONV, &a->original);
}

void bk_prompt_answer_wipe(struct bk_prompt_answer *a) {
    if (!a) return;
    bk_free_secret(a->password);
    a->password = NULL;
}

void bk_prompt_answer_free(struct bk_prompt_answer *a) {
    bk_prompt_answer_wipe(a);
    free(a);
}

/* ---- The terminal ---- */

/* After Enter at a proximity offer, while the module waits for that phone's push, the
 * program's hidden prompt is over and its terminal echoes again: a password typed then would
 * show in clear. When stdin is the tty PAM_TTY names (console login), echo is off for that
 * wait; if a push logs the person in, what was typed meanwhile is discarded. The keys that
 * interrupt or stop a program (Ctrl-C, Ctrl-\, Ctrl-Z) wait with it, so echo is back before
 * they act; SIGTERM and SIGHUP (shutdown, a hang-up) are never held, and the caller bounds the
 * wait (BK_QUIET_WAIT_MAX_MS). */
void bk_quiet_terminal_begin(struct bk_quiet_terminal *t, const char *tty) {
    char expected[256], name[256];
    t->saved = 0;
    if (!tty || !*tty || isatty(STDIN_FILENO) != 1 || ttyname_r(STDIN_FILENO, name, sizeof name) != 0) return;
    snprintf(expected, sizeof expected, "%s%s", strncmp(tty, "/dev/", 5) == 0 ? "" : "/dev/", tty);
    if (strcmp(name, expected) != 0 || tcgetattr(STDIN_FILENO, &t->before) != 0) return;
    sigset_t held;
    sigemptyset(&held);
    sigaddset(&held, SIGINT); sigaddset(&held, SIGQUIT); sigaddset(&held, SIGTSTP);
    if (pthread_sigmask(SIG_BLOCK, &held, &t->signals) != 0) return;
    struct termios quiet = t->before;
    quiet.c_lflag &= ~(tcflag_t)(ECHO | ECHONL);
    t->saved = tcsetattr(STDIN_FILENO, TCSANOW, &quiet) == 0;
    if (!t->saved) pthread_sigmask(SIG_SETMASK, &t->signals, NULL);
}

void bk_quiet_terminal_end(struct bk_quiet_terminal *t, int discard_typed) {
    if (!t->saved) return;
    if (discard_typed) tcflush(STDIN_FILENO, TCIFLUSH);
    tcsetattr(STDIN_FILENO, TCSANOW, &t->before);
    t->saved = 0;
    pthread_sigmask(SIG_SETMASK, &t->signals, NULL);
}

/* ---- Words ---- */

static void bind_catalog(void) {
    /* $BOXKEY_LOCALEDIR for tests; secure_getenv ignores it in setuid su and sudo. */
    const char *dir = secure_getenv("BOXKEY_LOCALEDIR");
    bindtextdomain("pam_boxkey", dir && *dir ? dir : "/usr/share/locale");
    bind_textdomain_codeset("pam_boxkey", "UTF-8");
}

void bk_say(char *out, size_t size, const char *msgid, const char *const *pairs, int n) {
    static pthread_once_t bound = PTHREAD_ONCE_INIT;
    pthread_once(&bound, bind_catalog);
    const char *text = dgettext("pam_boxkey", msgid);
    size_t used = 0;
    if (size == 0) return;
#define APPEND(p, len) do { size_t l_ = (len); if (l_ > size - 1 - used) l_ = size - 1 - used; memcpy(out + used, (p), l_); used += l_; } while (0)
    while (*text) {
        const char *open = strchr(text, '{'), *close = open ? strchr(open, '}') : NULL;
        if (!open) { APPEND(text, strlen(text)); break; }
        APPEND(text, (size_t)(open - text));
        int found = -1;
        for (int i = 0; close && i < n; i++)
            if (strlen(pairs[2 * i]) == (size_t)(close - open - 1) && strncmp(pairs[2 * i], open + 1, (size_t)(close - open - 1)) == 0) found = i;
        if (found < 0) { APPEND("{", 1); text = open + 1; continue; }
        APPEND(pairs[2 * found + 1], strlen(pairs[2 * found + 1]));
        text = close + 1;
    }
#undef APPEND
    out[used] = 0;
}

const char *bk_foreign(const char *domain, const char *msgid) { return dgettext(domain, msgid); }

/* ---- Options ---- */

int bk_unavailable_code(const struct bk_options *o) { return o->ignore_unavailable ? PAM_IGNORE : PAM_AUTHINFO_UNAVAIL; }

/* timeout=N, clamped to 5...600; a number too large for an int is the maximum, anything else
 * that is not a number the minimum. */
static int parse_timeout(const char *s) {
    const char *digits = s + (*s == '+' || *s == '-');
    int all_digits = *digits != 0;
    for (const char *p = digits; *p; p++) all_digits &= *p >= '0' && *p <= '9';
    if (!all_digits) return 5;
    if (strlen(digits) > 9) return *s == '-' ? 5 : 600;
    long n = strtol(s, NULL, 10);
    return n < 5 ? 5 : n > 600 ? 600 : (int)n;
}

void bk_options_parse(struct bk_options *o, pam_handle_t *pamh, int argc, const char **argv) {
    memset(o, 0, sizeof *o);
    o->timeout_seconds = 10;
    o->first_answer_ms = BK_FIRST_ANSWER_MS;
    o->socket = "/run/boxkey/pam.sock";
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        if (!arg) continue;
        if (strncmp(arg, "timeout=", 8) == 0) o->timeout_seconds = parse_timeout(arg + 8);
        else if (strncmp(arg, "socket=", 7) == 0 && arg[7]) o->socket = arg + 7; /* too long: connect fails */
        else if (strncmp(arg, "first_answer_ms=", 16) == 0) {
            long ms = strtol(arg + 16, NULL, 10);
            o->first_answer_ms = ms < 100 ? 100 : ms > 5000 ? 5000 : (int)ms;
        }
        else if (strcmp(arg, "debug") == 0) o->debug = 1;
        else if (strcmp(arg, "ignore_unavailable") == 0) o->ignore_unavailable = 1;
        else if (strcmp(arg, "answer_prompt") == 0) o->answer_prompt = 1;
        else if (strcmp(arg, "key") == 0) o->key_logins = 1;
        else if (strcmp(arg, "ask_password") == 0) o->ask_password = 1;
        else pam_syslog(pamh, LOG_ERR, "unknown option %s", arg);
    }
}
