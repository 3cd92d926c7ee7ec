/* libFuzzer target: the PAM module's decoder of the daemon's replies (Sources/pam_boxkey/wire.c),
 * which runs inside every PAM program, setuid su and sudo included. The contract: no crash, no
 * read outside the frame, every text field NUL-terminated within its buffer, and the secret
 * wiped by bk_reply_wipe. (The daemon's own decoder is FuzzPAMWire, in Swift.) */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "pam_boxkey_wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *copy = malloc(size ? size : 1);
    memcpy(copy, data, size);
    struct bk_reply reply;
    memset(&reply, 0xA5, sizeof reply);
    if (bk_decode_reply(copy, size, &reply) == BK_DECODED) {
        for (size_t i = 0; i < sizeof reply.text / sizeof reply.text[0]; i++)
            if (!memchr(reply.text[i], 0, sizeof reply.text[i])) abort();
    }
    bk_reply_wipe(&reply);
    free(copy);
    return 0;
}
