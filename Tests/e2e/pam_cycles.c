/* Runs pam_start / pam_authenticate / pam_end in a loop in one process, for the PAM module's
 * robustness and timing tests. Usage: pam_cycles SERVICE USER COUNT [RHOST [TTY]] (RHOST "": none)
 * Prints one line: cycles, the last return code, per-call max/mean milliseconds, and RSS after
 * 10 warm-up cycles and at the end (KiB). The conversation answers every prompt with nothing. */
#include <security/pam_appl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int quiet_conv(int n, const struct pam_message **msg, struct pam_response **resp, void *data) {
    (void)msg; (void)data;
    *resp = calloc(n, sizeof(struct pam_response));
    return *resp ? PAM_SUCCESS : PAM_BUF_ERR;
}

static long rss_kib(void) {
    long pages = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) { if (fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0; fclose(f); }
    return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int main(int argc, char **argv) {
    if (argc < 4) { fprintf(stderr, "usage: %s SERVICE USER COUNT [RHOST [TTY]]\n", argv[0]); return 2; }
    int count = atoi(argv[3]);
    struct pam_conv conv = { quiet_conv, NULL };
    double max = 0, total = 0;
    long rss_start = 0;
    int rc = PAM_SUCCESS;
    for (int i = 0; i < count; i++) {
        pam_handle_t *pamh = NULL;
        if (pam_start(argv[1], argv[2], &conv, &pamh) != PAM_SUCCESS) { fprintf(stderr, "pam_start failed\n"); return 1; }
        if (argc > 4 && argv[4][0]) pam_set_item(pamh, PAM_RHOST, argv[4]);
        if (argc > 5) pam_set_item(pamh, PAM_TTY, argv[5]);
        double t0 = now_ms();
        rc = pam_authenticate(pamh, PAM_SILENT);
        double dt = now_ms() - t0;
        pam_end(pamh, rc);
        if (dt > max) max = dt;
        total += dt;
        if (i == 9) rss_start = rss_kib();
    }
    printf("cycles=%d rc=%d max_ms=%.3f mean_ms=%.3f rss_start_kib=%ld rss_end_kib=%ld\n",
           count, rc, max, total / count, rss_start, rss_kib());
    return 0;
}
