/* A test verifier that behaves as pam_sss, pam_krb5 or pam_ldap do with use_first_pass (what
   pam-auth-update gives every module after the first): it never asks, it only reads
   PAM_AUTHTOK, and succeeds when that is password=VALUE. With incomplete_once it first returns
   PAM_INCOMPLETE on each handle (an application then calls pam_authenticate again); its
   password stack asks "New password: " as pam_unix's does. */
#include <security/pam_ext.h>
#include <security/pam_modules.h>
#include <stdlib.h>
#include <string.h>

int pam_sm_authenticate(pam_handle_t *pamh, int flags, int argc, const char **argv) {
    const void *token = NULL, *seen = NULL;
    (void)flags;
    for (int i = 0; i < argc; i++)
        if (strcmp(argv[i], "incomplete_once") == 0 && pam_get_data(pamh, "first_pass_only_seen", &seen) != PAM_SUCCESS) {
            pam_set_data(pamh, "first_pass_only_seen", (void *)1, NULL);
            return PAM_INCOMPLETE;
        }
    if (pam_get_item(pamh, PAM_AUTHTOK, &token) != PAM_SUCCESS || token == NULL) return PAM_AUTH_ERR;
    for (int i = 0; i < argc; i++)
        if (strncmp(argv[i], "password=", 9) == 0 && strcmp(argv[i] + 9, (const char *)token) == 0) return PAM_SUCCESS;
    return PAM_AUTH_ERR;
}

int pam_sm_setcred(pam_handle_t *pamh, int flags, int argc, const char **argv) {
    (void)pamh; (void)flags; (void)argc; (void)argv;
    return PAM_SUCCESS;
}

int pam_sm_chauthtok(pam_handle_t *pamh, int flags, int argc, const char **argv) {
    char *typed = NULL;
    (void)argc; (void)argv;
    if (flags & PAM_PRELIM_CHECK) return PAM_SUCCESS;
    int rc = pam_prompt(pamh, PAM_PROMPT_ECHO_OFF, &typed, "New password: ");
    free(typed);
    return rc;
}
