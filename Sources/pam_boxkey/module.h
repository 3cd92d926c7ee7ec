/* pam_boxkey's parts, shared between its files; nothing here leaves the module
 * (pam/pam_boxkey.map exports only pam_sm_*). */
#ifndef PAM_BOXKEY_MODULE_H
#define PAM_BOXKEY_MODULE_H
#include <security/pam_appl.h>
#include <security/pam_ext.h>
#include <security/pam_modules.h>
#include <stdint.h>
#include <syslog.h>
#include <signal.h>
#include <termios.h>

#include "pam_boxkey_wire.h"

#define BK_HIDDEN __attribute__((visibility("hidden")))
#define BK_EXPORT __attribute__((visibility("default")))

/* ---- Module arguments from the PAM configuration line (pam_boxkey(8)). ---- */
struct bk_options {
    /* After Enter, the longest wait for the push of the phone whose proximity offer is at the
     * prompt: default 10, clamped to 5...600. */
    int timeout_seconds;
    const char *socket; /* argv's, alive for the call */
    int debug;
    /* PAM_IGNORE instead of PAM_AUTHINFO_UNAVAIL when no push is used. */
    int ignore_unavailable;
    /* Also answer the next module's first hidden prompt with the password (pam_matrix). */
    int answer_prompt;
    /* With no push, ask for the password here for the use_first_pass modules after this one. */
    int ask_password;
    /* Key mode: return PAM_SUCCESS for a key login the daemon hands over. */
    int key_logins;
    /* How long the daemon has to answer whether phone login is offered here, in ms
     * (first_answer_ms=, clamped to 100...5000; default BK_FIRST_ANSWER_MS). */
    int first_answer_ms;
};

/* A healthy daemon answers in milliseconds: 1.2 ms median, 14 ms at p99.9 with 16 programs
 * opening prompts at once on 2 cores (scripts/bench, figure 6c). A slower one (hung, logind
 * not answering) is skipped, and this is all a hung daemon costs each prompt until systemd's
 * watchdog restarts it; a skipped prompt is password-only, never locked. 250 ms was tried
 * first and was too little for a fresh box's first prompt on the VM lab's emulated CPU. */
enum { BK_FIRST_ANSWER_MS = 500 };

BK_HIDDEN void bk_options_parse(struct bk_options *o, pam_handle_t *pamh, int argc, const char **argv);
BK_HIDDEN int bk_unavailable_code(const struct bk_options *o);

/* ---- The daemon's socket: blocking calls, each bounded by poll. ---- */
enum bk_client_error { BK_CLIENT_OK = 0, BK_CLIENT_UNAVAILABLE, BK_CLIENT_TIMED_OUT, BK_CLIENT_CLOSED, BK_CLIENT_PROTOCOL };

struct bk_client {
    int fd;
    int error_number; /* errno of an unavailable daemon */
    enum bk_decode_error decode_error;
};

/* Connects without blocking: a missing, dead or wedged daemon fails at once. */
BK_HIDDEN enum bk_client_error bk_client_open(struct bk_client *c, const char *path);
/* Sends a frame (then wipes it), waiting at most a second for the socket to take it. */
BK_HIDDEN enum bk_client_error bk_client_send(struct bk_client *c, struct bk_frame *f);
/* Reads one reply, waiting at most timeout_ms in all. */
BK_HIDDEN enum bk_client_error bk_client_receive(struct bk_client *c, int64_t timeout_ms, struct bk_reply *out);
BK_HIDDEN void bk_client_close(struct bk_client *c);
BK_HIDDEN const char *bk_client_error_text(const struct bk_client *c, enum bk_client_error e);

/* ---- The application's conversation. ---- */
/* Asks through the conversation; the answer is malloc'd (the caller wipes and frees it), NULL
 * when the conversation failed or gave none (Ctrl-D, a greeter's Cancel). */
BK_HIDDEN char *bk_ask(pam_handle_t *pamh, int style, const char *text);
/* Shows a line (PAM_TEXT_INFO). */
BK_HIDDEN void bk_info(pam_handle_t *pamh, const char *text);
/* A PAM item as a string; NULL when unset or empty. */
BK_HIDDEN const char *bk_item(pam_handle_t *pamh, int type);
/* Frees a string after wiping it. */
BK_HIDDEN void bk_free_secret(char *s);

/* A conversation in front of the application's, installed once a password is at hand. It
 * notes whether a later hidden prompt reached the person (then the password the stack
 * verified may be theirs, not the phone's), and with answer_first answers the first hidden
 * prompt with the password, once. */
struct bk_prompt_answer {
    struct pam_conv original;
    char *password;
    int answer_first;
    int person_answered;
};

BK_HIDDEN struct bk_prompt_answer *bk_prompt_answer_install(pam_handle_t *pamh, const char *password, int answer_first);
BK_HIDDEN void bk_prompt_answer_uninstall(struct bk_prompt_answer *a, pam_handle_t *pamh);
BK_HIDDEN void bk_prompt_answer_wipe(struct bk_prompt_answer *a);
BK_HIDDEN void bk_prompt_answer_free(struct bk_prompt_answer *a);

/* Echo off on the login terminal while the module waits for a push after Enter. */
struct bk_quiet_terminal {
    int saved;
    struct termios before;
    sigset_t signals; /* the thread's mask before the wait */
};
/* The longest wait for the offering phone's push after Enter: the daemon's own wait is at most
 * its longest command timeout (command_timeout_s, 120 s), and one second more is its answer's. */
#define BK_QUIET_WAIT_MAX_MS 121000
BK_HIDDEN void bk_quiet_terminal_begin(struct bk_quiet_terminal *t, const char *tty);
BK_HIDDEN void bk_quiet_terminal_end(struct bk_quiet_terminal *t, int discard_typed);

/* ---- Words, in the application's locale. ---- */
/* Fills {name} placeholders of the translated msgid with values, in one pass (a value is
 * never read as a placeholder): pairs is name, value, name, value..., n pairs. */
BK_HIDDEN void bk_say(char *out, size_t size, const char *msgid, const char *const *pairs, int n);
/* Another package's message in its catalog (Linux-PAM's "Password: "). */
BK_HIDDEN const char *bk_foreign(const char *domain, const char *msgid);

#endif
