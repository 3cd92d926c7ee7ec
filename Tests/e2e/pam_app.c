/* A PAM application with a script, for the module's attack tests (test_pam_module_attacks.py).
 * Usage: pam_app SERVICE USER ACTION...   Actions, in order, on one handle unless named:
 *   auth          pam_authenticate (the conversation answers each prompt with the next of
 *                 $ANSWERS, '|'-separated; "ENTER" is an empty answer; none left: empty)
 *   swapconv      installs a new conversation and frees the old one's data, as a program may
 *   chauthtok     pam_chauthtok
 *   twohandles    handles X (USER) and Y ($OTHER_USER): X auth, Y auth, X auth, Y auth, then
 *                 both ended (for a stack whose verifier returns PAM_INCOMPLETE once)
 * Every message is printed as "[appdata] STYLE: text"; the conversation says "FREED" when it is
 * given data the application has freed, and every call prints "ACTION -> rc". */
#include <security/pam_appl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct data { int alive; char name[8]; };
static char *answers[32];
static int n_answers, next_answer;

static int conversation(int n, const struct pam_message **m, struct pam_response **r, void *appdata) {
    struct data *d = appdata;
    if (!d->alive) printf("FREED conversation data used\n");
    struct pam_response *resp = calloc((size_t)n, sizeof *resp);
    if (!resp) return PAM_BUF_ERR;
    for (int i = 0; i < n; i++) {
        int style = m[i]->msg_style;
        printf("[%s] %s: %s\n", d->name, style == PAM_PROMPT_ECHO_OFF ? "HIDDEN" : style == PAM_PROMPT_ECHO_ON ? "VISIBLE" : "INFO", m[i]->msg);
        if (style != PAM_PROMPT_ECHO_OFF && style != PAM_PROMPT_ECHO_ON) continue;
        const char *a = next_answer < n_answers ? answers[next_answer++] : "ENTER";
        resp[i].resp = strdup(strcmp(a, "ENTER") == 0 ? "" : a);
    }
    fflush(stdout);
    *r = resp;
    return PAM_SUCCESS;
}

static struct data *new_data(const char *name) {
    struct data *d = calloc(1, sizeof *d);
    d->alive = 1;
    snprintf(d->name, sizeof d->name, "%s", name);
    return d;
}

int main(int argc, char **argv) {
    if (argc < 4) { fprintf(stderr, "usage: %s SERVICE USER ACTION...\n", argv[0]); return 2; }
    if (getenv("ANSWERS")) {
        char *s = strdup(getenv("ANSWERS")), *save = NULL;
        for (char *t = strtok_r(s, "|", &save); t && n_answers < 32; t = strtok_r(NULL, "|", &save)) answers[n_answers++] = t;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    struct data *current = new_data("A");
    struct pam_conv conv = { conversation, current };
    pam_handle_t *h = NULL;
    if (pam_start(argv[1], argv[2], &conv, &h) != PAM_SUCCESS) return 1;
    if (isatty(0)) pam_set_item(h, PAM_TTY, ttyname(0)); /* as login does */
    int rc = PAM_SUCCESS;
    for (int i = 3; i < argc; i++) {
        if (strcmp(argv[i], "auth") == 0) rc = pam_authenticate(h, 0);
        else if (strcmp(argv[i], "chauthtok") == 0) rc = pam_chauthtok(h, 0);
        else if (strcmp(argv[i], "swapconv") == 0) {
            struct data *next = new_data("B");
            struct pam_conv c = { conversation, next };
            rc = pam_set_item(h, PAM_CONV, &c);
            current->alive = 0; /* "freed": kept readable so the test sees its use, not a crash */
            current = next;
        } else if (strcmp(argv[i], "twohandles") == 0) {
            pam_handle_t *y = NULL;
            struct pam_conv cy = { conversation, new_data("Y") };
            ((struct data *)conv.appdata_ptr)->name[0] = 'X';
            if (pam_start(argv[1], getenv("OTHER_USER"), &cy, &y) != PAM_SUCCESS) return 1;
            printf("X auth -> %d\n", pam_authenticate(h, 0));
            printf("Y auth -> %d\n", pam_authenticate(y, 0));
            printf("X auth -> %d\n", rc = pam_authenticate(h, 0));
            int ry = pam_authenticate(y, 0);
            printf("Y auth -> %d\n", ry);
            pam_end(y, ry);
            continue;
        }
        printf("%s -> %d\n", argv[i], rc);
    }
    pam_end(h, rc);
    return 0;
}
