/* The module's side of the wire between pam_boxkey.so and boxkeyd (BoxkeyPAMWire/PAMWire.swift
 * is the daemon's side; PAMWireCrossTests checks the two against each other).
 *
 * Frame: length (2, BE, of what follows) | version (1) | type (1) | body. Strings are
 * length (1) | UTF-8 without control characters; a secret is length (2, BE) | bytes.
 * Pure: no I/O, no PAM, no allocation. Only the requests a login stack makes are here; the
 * administrator's requests are not the module's to send. */
#ifndef PAM_BOXKEY_WIRE_H
#define PAM_BOXKEY_WIRE_H
#include <stddef.h>
#include <stdint.h>

#define BK_WIRE_VERSION 3
#define BK_MAX_FRAME 2048 /* a frame's length, not counting the 2-byte prefix */
#define BK_MAX_TEXT 255
#define BK_MAX_SECRET 512

/* Module to daemon. */
enum bk_request_kind {
    BK_WAIT_FOR_PUSH = 0x02, BK_CANCEL = 0x03, BK_REPORT_OUTCOME = 0x04,
    BK_OPEN_SESSION = 0x05, BK_CLOSE_SESSION = 0x06, BK_CAPTURED_PASSWORD = 0x07, BK_INTENT = 0x08,
};

/* What the stack decided about a push: accepted_other when the password it verified is not
 * the one pushed (someone typed one): the phone gets no credit. */
enum bk_verdict { BK_REJECTED = 0, BK_ACCEPTED = 1, BK_ACCEPTED_OTHER = 2 };

/* Daemon to module. */
enum bk_reply_kind {
    BK_PROMPT = 0x81, BK_PUSH = 0x82, BK_NO_PUSH = 0x83, BK_OK = 0x84, BK_ERROR = 0x85,
    BK_NOT_OFFERED = 0x87, BK_KEY_LOGIN = 0x88, BK_ESCROW_CAPTURE = 0x89,
    /* Nothing yet, and a new pairing code (text[0]) for number seconds: the one the prompt
     * showed is used up or expired. */
    BK_NOTHING_YET_NEW_CODE = 0x8A,
};

enum bk_no_push { BK_TIMED_OUT = 0, BK_SUPERSEDED = 1, BK_SHUTTING_DOWN = 2, BK_NOTHING_YET = 3 };

/* A frame being written, its length prefix included. */
struct bk_frame {
    uint8_t bytes[2 + BK_MAX_FRAME];
    size_t length;
};

void bk_frame_begin(struct bk_frame *f, uint8_t kind);
void bk_frame_u8(struct bk_frame *f, uint8_t v);
void bk_frame_u32(struct bk_frame *f, uint32_t v);
/* At most 255 bytes of the string, as the daemon's writer does. */
void bk_frame_text(struct bk_frame *f, const char *s);
void bk_frame_secret(struct bk_frame *f, const uint8_t *bytes, size_t count);
/* Writes the length prefix; the frame is then bytes[0 ..< length]. */
void bk_frame_end(struct bk_frame *f);

/* The requests, each a whole frame. */
void bk_encode_wait_for_push(struct bk_frame *f, const char *service, const char *tty, const char *display,
                             const char *remote_host, const char *expected_user, uint32_t timeout_ms);
void bk_encode_cancel(struct bk_frame *f);
void bk_encode_intent(struct bk_frame *f);
void bk_encode_report_outcome(struct bk_frame *f, enum bk_verdict verdict, const char *reason);
void bk_encode_captured_password(struct bk_frame *f, const uint8_t *password, size_t count);
void bk_encode_open_session(struct bk_frame *f, const char *user, const char *session, const char *service, const char *ticket);
void bk_encode_close_session(struct bk_frame *f, const char *session);

/* A decoded reply. Which fields are set depends on kind:
 *   prompt:          text[0] box ID, text[1] fingerprint, text[2] pairing code, number its seconds
 *   not_offered, error: text[0] why
 *   push:            text[0] user, secret the password, text[1] ticket
 *   key_login, escrow_capture: text[0] user, text[1] ticket
 *   no_push:         number the reason (enum bk_no_push)
 * The secret is the caller's to wipe (bk_reply_wipe). */
struct bk_reply {
    uint8_t kind;
    char text[3][BK_MAX_TEXT + 1];
    uint32_t number;
    uint8_t secret[BK_MAX_SECRET + 1]; /* NUL-terminated: a push's password has no NUL inside */
    size_t secret_length;
};

enum bk_decode_error {
    BK_DECODED = 0, BK_TRUNCATED, BK_TRAILING_BYTES, BK_UNSUPPORTED_VERSION, BK_UNKNOWN_TYPE,
    BK_TOO_LONG, BK_INVALID_TEXT, BK_INVALID_VALUE,
};

/* Decodes one frame body (without the 2-byte length), exactly: anything the daemon's own
 * decoder would refuse is refused. */
enum bk_decode_error bk_decode_reply(const uint8_t *body, size_t count, struct bk_reply *out);
void bk_reply_wipe(struct bk_reply *r);
const char *bk_decode_error_text(enum bk_decode_error e);

/* Whether bytes are UTF-8 as Swift's String(validating:) takes it (no overlong forms, no
 * surrogates, nothing past U+10FFFF). */
int bk_valid_utf8(const uint8_t *s, size_t count);
/* UTF-8 with no control character (C0, DEL, C1): what a string on the wire may be. */
int bk_valid_text(const uint8_t *s, size_t count);

#endif
