/* A login the rest of the stack is verifying, reported to the daemon once (pending.c). */
#ifndef PAM_BOXKEY_PENDING_H
#define PAM_BOXKEY_PENDING_H
#include <pthread.h>

#include "module.h"

enum bk_pending_state { BK_PENDING_STATE, BK_REPORTED_STATE };

struct bk_pending {
    enum bk_pending_state state;
    pam_handle_t *pamh;
    struct bk_client client;
    /* Names this push when the session opens (pam_sm_open_session). */
    char ticket[BK_MAX_TEXT + 1];
    int debug;
    /* The proxy conversation, when one is installed (a push, a capture). */
    struct bk_prompt_answer *answer;
    /* Escrow capture: the password typed at this module's prompt, sent to the daemon to seal
     * if the stack accepts it (PAM clears PAM_AUTHTOK before the verdict hook runs). */
    char *captured;
    /* The application's PAM_FAIL_DELAY function, which the verdict hook chains to. */
    const void *application_delay;
    int hooked;
    pthread_t thread; /* the thread that hooked it */
    struct bk_pending *next; /* the thread's hooked pending logins */
    /* 0: a typed password kept for answer_prompt, nothing to report. */
    int tell_daemon;
};

BK_HIDDEN extern const char *const bk_pending_key;

/* Takes over the client's connection (client->fd is -1 afterwards); NULL: no daemon to tell. */
BK_HIDDEN struct bk_pending *bk_pending_new(pam_handle_t *pamh, struct bk_client *client, const char *ticket, int debug);
/* Puts its proxy in front of the conversation (a pass-through one if it has none yet), hooks
 * the verdict and hands the pending login to PAM, which frees it at pam_end; on failure it is
 * freed here and 0 returned. */
BK_HIDDEN int bk_pending_keep(struct bk_pending *p);
/* The pending login on this handle, if any. */
BK_HIDDEN struct bk_pending *bk_pending_find(pam_handle_t *pamh);
/* pending → reported: tells the daemon the stack's verdict; later calls do nothing. */
BK_HIDDEN void bk_pending_report(struct bk_pending *p, int accepted, const char *reason);
#endif
