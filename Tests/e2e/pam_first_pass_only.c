/* A test verifier that behaves as pam_sss, pam_krb5 or pam_ldap do with use_first_pass (what
   pam-auth-update gives every module after the first): it never asks, it only reads
   PAM_AUTHTOK, and succeeds when that is password=VALUE. */
#include <security/pam_modules.h>
#include <string.h>

int pam_sm_authenticate(pam_handle_t *pamh, int flags, int argc, const char **argv) {
    const void *token = NULL;
    (void)flags;
    if (pam_get_item(pamh, PAM_AUTHTOK, &token) != PAM_SUCCESS || token == NULL) return PAM_AUTH_ERR;
    for (int i = 0; i < argc; i++)
        if (strncmp(argv[i], "password=", 9) == 0 && strcmp(argv[i] + 9, (const char *)token) == 0) return PAM_SUCCESS;
    return PAM_AUTH_ERR;
}

int pam_sm_setcred(pam_handle_t *pamh, int flags, int argc, const char **argv) {
    (void)pamh; (void)flags; (void)argc; (void)argv;
    return PAM_SUCCESS;
}
