/* A login the rest of the stack is verifying: a phone's push, key login or escrow capture,
 * reported to the daemon exactly once. Two states, pending → reported; the report comes from
 * the first of:
 *   1. the verdict hook: Linux-PAM calls the PAM_FAIL_DELAY function with the stack's final
 *      status at the end of every pam_authenticate (libpam/pam_delay.c), success or not;
 *   2. pam_sm_setcred (establish, reinitialise, refresh) or pam_sm_open_session: the
 *      application went on, so the stack accepted;
 *   3. the data's cleanup: pam_end with its status, or a retry on the same handle
 *      (PAM_DATA_REPLACE: the earlier attempt failed).
 * The pending login is PAM data on the handle; libpam frees it at pam_end. A password typed
 * at this module's prompt with `answer_prompt` is a pending login too, one that tells the
 * daemon nothing: its proxy is wiped and taken away when authentication ends. */
#define _GNU_SOURCE
#include "pending.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *const bk_pending_key = "pam_boxkey_pending";

/* Every hooked pending login in the process. The delay hook gets only the conversation's
 * appdata (the pending login's proxy) and runs on the thread of pam_authenticate; pam_end may
 * run on another (after PAM_INCOMPLETE, a display manager's worker), so the list is the
 * process's, under a lock, never a thread's: a pending login freed anywhere leaves it. */
static pthread_mutex_t hooked_lock = PTHREAD_MUTEX_INITIALIZER;
static struct bk_pending *hooked;

static void verdict_hook(int status, unsigned delay, void *appdata);

struct bk_pending *bk_pending_new(pam_handle_t *pamh, struct bk_client *client, const char *ticket, int debug) {
    struct bk_pending *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->pamh = pamh;
    p->client.fd = -1;
    if (client) {
        p->client = *client;
        client->fd = -1; /* the connection is the pending login's now */
        p->tell_daemon = 1;
    }
    snprintf(p->ticket, sizeof p->ticket, "%s", ticket);
    p->debug = debug;
    p->state = BK_PENDING_STATE;
    return p;
}

static void hook(struct bk_pending *p) {
    const void *delay = NULL;
    pam_get_item(p->pamh, PAM_FAIL_DELAY, &delay);
    p->application_delay = delay;
    pthread_mutex_lock(&hooked_lock);
    p->thread = pthread_self();
    p->next = hooked;
    hooked = p;
    p->hooked = 1;
    pthread_mutex_unlock(&hooked_lock);
    pam_set_item(p->pamh, PAM_FAIL_DELAY, (const void *)verdict_hook);
}

static void unhook(struct bk_pending *p) {
    pthread_mutex_lock(&hooked_lock);
    int was = p->hooked;
    p->hooked = 0;
    for (struct bk_pending **q = &hooked; was && *q; q = &(*q)->next)
        if (*q == p) { *q = p->next; break; }
    p->next = NULL;
    pthread_mutex_unlock(&hooked_lock);
    if (was) pam_set_item(p->pamh, PAM_FAIL_DELAY, p->application_delay);
}

static void free_pending(struct bk_pending *p) {
    unhook(p);
    bk_client_close(&p->client);
    bk_prompt_answer_uninstall(p->answer, p->pamh);
    bk_prompt_answer_free(p->answer);
    bk_free_secret(p->captured);
    free(p);
}

static void cleanup(pam_handle_t *pamh, void *data, int status) {
    struct bk_pending *p = data;
    if (!p) return;
    (void)pamh;
    unhook(p);
    if (status & PAM_DATA_REPLACE) {
        bk_pending_report(p, 0, "the password was not accepted");
    } else {
        int code = status & ~PAM_DATA_SILENT;
        bk_pending_report(p, code == PAM_SUCCESS, code == PAM_SUCCESS ? "" : pam_strerror(p->pamh, code));
    }
    free_pending(p);
}

int bk_pending_keep(struct bk_pending *p) {
    /* Every pending login has its proxy in front of the application's conversation: the
     * verdict hook knows its own by it. */
    if (!p->answer && !(p->answer = bk_prompt_answer_install(p->pamh, NULL, 0))) { free_pending(p); return 0; }
    hook(p);
    if (pam_set_data(p->pamh, bk_pending_key, p, cleanup) != PAM_SUCCESS) { free_pending(p); return 0; }
    return 1;
}

struct bk_pending *bk_pending_find(pam_handle_t *pamh) {
    const void *data = NULL;
    if (pam_get_data(pamh, bk_pending_key, &data) != PAM_SUCCESS) return NULL;
    return (struct bk_pending *)data;
}

void bk_pending_report(struct bk_pending *p, int accepted, const char *reason) {
    if (p->state == BK_REPORTED_STATE) return;
    p->state = BK_REPORTED_STATE;
    /* Credit only for what the phone did: a success after the person answered a hidden
     * prompt (the verifier asking again after a wrong push) is not the phone's. */
    enum bk_verdict verdict = !accepted ? BK_REJECTED : (p->answer && p->answer->person_answered) ? BK_ACCEPTED_OTHER : BK_ACCEPTED;
    if (p->tell_daemon) {
        struct bk_frame f;
        /* Escrow: only a password the stack accepted as the one typed here is sealed. */
        if (verdict == BK_ACCEPTED && p->captured) {
            bk_encode_captured_password(&f, (const uint8_t *)p->captured, strlen(p->captured));
            bk_client_send(&p->client, &f);
        }
        bk_encode_report_outcome(&f, verdict, reason);
        enum bk_client_error e = bk_client_send(&p->client, &f);
        struct bk_reply reply;
        if (e == BK_CLIENT_OK) e = bk_client_receive(&p->client, 1000, &reply);
        if (e != BK_CLIENT_OK)
            pam_syslog(p->pamh, LOG_WARNING, "could not report the outcome to boxkeyd: %s", bk_client_error_text(&p->client, e));
    }
    bk_client_close(&p->client);
    bk_free_secret(p->captured);
    p->captured = NULL;
    /* Authentication is over: the proxy neither answers nor watches any later prompt (a
     * password change in the same transaction must not be handed this password). */
    bk_prompt_answer_wipe(p->answer);
    bk_prompt_answer_uninstall(p->answer, p->pamh);
}

/* The hooked pending login whose proxy `appdata` is; when the application replaced its
 * conversation meanwhile, the only one this thread hooked (two: neither is known for sure). */
static struct bk_pending *owner(void *appdata) {
    struct bk_pending *found = NULL, *mine = NULL;
    int mine_count = 0;
    pthread_mutex_lock(&hooked_lock);
    for (struct bk_pending *p = hooked; p && !found; p = p->next) {
        if (p->answer && (void *)p->answer == appdata) found = p;
        else if (pthread_equal(p->thread, pthread_self())) { mine = p; mine_count++; }
    }
    pthread_mutex_unlock(&hooked_lock);
    return found ? found : mine_count == 1 ? mine : NULL;
}

/* Report 1: the stack's final status, then the application's own delay function (or the
 * delay a module asked for, as PAM would apply it). */
static void verdict_hook(int status, unsigned delay, void *appdata) {
    struct bk_pending *p = owner(appdata);
    if (!p) {
        if (status != PAM_SUCCESS && delay > 0) usleep(delay);
        return;
    }
    unhook(p);
    bk_pending_report(p, status == PAM_SUCCESS, status == PAM_SUCCESS ? "" : pam_strerror(p->pamh, status));
    if (p->application_delay) {
        void (*chained)(int, unsigned, void *) = (void (*)(int, unsigned, void *))p->application_delay;
        /* The application's function expects its own conversation data, not our proxy's. */
        chained(status, delay, (void *)p->answer == appdata ? p->answer->original.appdata_ptr : appdata);
    } else if (status != PAM_SUCCESS && delay > 0) {
        usleep(delay);
    }
}
