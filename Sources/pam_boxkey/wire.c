/* The module's side of the daemon's wire (pam_boxkey_wire.h). */
#define _GNU_SOURCE
#include "pam_boxkey_wire.h"

#include <string.h>

void bk_frame_begin(struct bk_frame *f, uint8_t kind) {
    f->length = 2;
    f->bytes[f->length++] = BK_WIRE_VERSION;
    f->bytes[f->length++] = kind;
}

/* The requests are bounded (5 strings of 255 bytes, a secret of 512), so a frame never
 * reaches BK_MAX_FRAME; the check keeps a mistake from writing past the buffer. */
static void put(struct bk_frame *f, const void *bytes, size_t count) {
    if (count > sizeof f->bytes - f->length) count = sizeof f->bytes - f->length;
    memcpy(f->bytes + f->length, bytes, count);
    f->length += count;
}

void bk_frame_u8(struct bk_frame *f, uint8_t v) { put(f, &v, 1); }

void bk_frame_u32(struct bk_frame *f, uint32_t v) {
    uint8_t b[4] = { (uint8_t)(v >> 24), (uint8_t)(v >> 16), (uint8_t)(v >> 8), (uint8_t)v };
    put(f, b, 4);
}

/* The length of the UTF-8 sequence at `s` (at most `left` bytes) and its code point; 0 when it
 * is not well-formed (a stray or cut byte, an overlong form, a surrogate, past U+10FFFF). */
static size_t utf8_sequence(const unsigned char *s, size_t left, uint32_t *cp) {
    size_t n = s[0] < 0x80 ? 1 : (s[0] & 0xE0) == 0xC0 ? 2 : (s[0] & 0xF0) == 0xE0 ? 3 : (s[0] & 0xF8) == 0xF0 ? 4 : 0;
    if (n == 0 || n > left) return 0;
    uint32_t v = n == 1 ? s[0] : s[0] & (0x7F >> n);
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        v = v << 6 | (s[i] & 0x3F);
    }
    static const uint32_t least[] = { 0, 0, 0x80, 0x800, 0x10000 };
    if (v < least[n] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
    *cp = v;
    return n;
}

/* As the daemon's writer (PAMWire.Writer.text): at most 255 bytes of whole characters, a
 * control character (C0, DEL, C1: every decoder refuses them) as a space, a byte that is not
 * UTF-8 as U+FFFD. Never cut inside a character. */
void bk_frame_text(struct bk_frame *f, const char *s) {
    unsigned char out[BK_MAX_TEXT];
    size_t n = 0, left = s ? strlen(s) : 0;
    const unsigned char *in = (const unsigned char *)s;
    while (left > 0) {
        uint32_t cp = 0;
        size_t len = utf8_sequence(in, left, &cp);
        const unsigned char *bytes = in, replacement[] = { 0xEF, 0xBF, 0xBD }, space[] = { ' ' };
        size_t count = len;
        if (len == 0) { bytes = replacement; count = sizeof replacement; len = 1; }
        else if (cp < 0x20 || (cp >= 0x7F && cp <= 0x9F)) { bytes = space; count = 1; }
        if (n + count > sizeof out) break;
        memcpy(out + n, bytes, count);
        n += count;
        in += len;
        left -= len;
    }
    bk_frame_u8(f, (uint8_t)n);
    put(f, out, n);
}

void bk_frame_secret(struct bk_frame *f, const uint8_t *bytes, size_t count) {
    if (count > BK_MAX_SECRET) count = BK_MAX_SECRET;
    uint8_t n[2] = { (uint8_t)(count >> 8), (uint8_t)count };
    put(f, n, 2);
    put(f, bytes, count);
}

void bk_frame_end(struct bk_frame *f) {
    size_t body = f->length - 2;
    f->bytes[0] = (uint8_t)(body >> 8);
    f->bytes[1] = (uint8_t)body;
}

void bk_encode_wait_for_push(struct bk_frame *f, const char *service, const char *tty, const char *display,
                             const char *remote_host, const char *expected_user, uint32_t timeout_ms) {
    bk_frame_begin(f, BK_WAIT_FOR_PUSH);
    bk_frame_text(f, service);
    bk_frame_text(f, tty);
    bk_frame_text(f, display);
    bk_frame_text(f, remote_host);
    bk_frame_text(f, expected_user);
    bk_frame_u32(f, timeout_ms);
    bk_frame_end(f);
}

void bk_encode_cancel(struct bk_frame *f) { bk_frame_begin(f, BK_CANCEL); bk_frame_end(f); }

void bk_encode_intent(struct bk_frame *f) { bk_frame_begin(f, BK_INTENT); bk_frame_end(f); }

void bk_encode_report_outcome(struct bk_frame *f, enum bk_verdict verdict, const char *reason) {
    bk_frame_begin(f, BK_REPORT_OUTCOME);
    bk_frame_u8(f, (uint8_t)verdict);
    bk_frame_text(f, reason);
    bk_frame_end(f);
}

void bk_encode_captured_password(struct bk_frame *f, const uint8_t *password, size_t count) {
    bk_frame_begin(f, BK_CAPTURED_PASSWORD);
    bk_frame_secret(f, password, count);
    bk_frame_end(f);
}

void bk_encode_open_session(struct bk_frame *f, const char *user, const char *session, const char *service, const char *ticket) {
    bk_frame_begin(f, BK_OPEN_SESSION);
    bk_frame_text(f, user);
    bk_frame_text(f, session);
    bk_frame_text(f, service);
    bk_frame_text(f, ticket);
    bk_frame_end(f);
}

void bk_encode_close_session(struct bk_frame *f, const char *session) {
    bk_frame_begin(f, BK_CLOSE_SESSION);
    bk_frame_text(f, session);
    bk_frame_end(f);
}

int bk_valid_utf8(const uint8_t *s, size_t count) {
    size_t i = 0;
    while (i < count) {
        uint8_t c = s[i];
        size_t n;
        uint32_t v, min;
        if (c < 0x80) { i++; continue; }
        if ((c & 0xe0) == 0xc0) { n = 1; v = c & 0x1f; min = 0x80; }
        else if ((c & 0xf0) == 0xe0) { n = 2; v = c & 0x0f; min = 0x800; }
        else if ((c & 0xf8) == 0xf0) { n = 3; v = c & 0x07; min = 0x10000; }
        else return 0;
        if (n > count - i - 1) return 0;
        for (size_t k = 1; k <= n; k++) {
            if ((s[i + k] & 0xc0) != 0x80) return 0;
            v = v << 6 | (s[i + k] & 0x3f);
        }
        if (v < min || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff)) return 0;
        i += n + 1;
    }
    return 1;
}

struct reader {
    const uint8_t *bytes;
    size_t count, offset;
};

static enum bk_decode_error take(struct reader *r, size_t n, const uint8_t **out) {
    if (n > r->count - r->offset) return BK_TRUNCATED;
    *out = r->bytes + r->offset;
    r->offset += n;
    return BK_DECODED;
}

static enum bk_decode_error u8(struct reader *r, uint8_t *v) {
    const uint8_t *p;
    enum bk_decode_error e = take(r, 1, &p);
    if (e == BK_DECODED) *v = *p;
    return e;
}

static enum bk_decode_error u32(struct reader *r, uint32_t *v) {
    const uint8_t *p;
    enum bk_decode_error e = take(r, 4, &p);
    if (e == BK_DECODED) *v = (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
    return e;
}

int bk_valid_text(const uint8_t *s, size_t count) {
    if (!bk_valid_utf8(s, count)) return 0;
    for (size_t i = 0; i < count; i++) {
        if (s[i] < 0x20 || s[i] == 0x7f) return 0;                                     /* C0, DEL */
        if (s[i] == 0xc2 && i + 1 < count && s[i + 1] >= 0x80 && s[i + 1] <= 0x9f) return 0; /* C1 */
    }
    return 1;
}

/* A string: UTF-8, and no control characters (they could rewrite what a terminal shows). */
static enum bk_decode_error text(struct reader *r, char out[BK_MAX_TEXT + 1]) {
    uint8_t n;
    const uint8_t *p;
    enum bk_decode_error e = u8(r, &n);
    if (e != BK_DECODED || (e = take(r, n, &p)) != BK_DECODED) return e;
    if (!bk_valid_text(p, n)) return BK_INVALID_TEXT;
    memcpy(out, p, n);
    out[n] = 0;
    return BK_DECODED;
}

static enum bk_decode_error secret(struct reader *r, struct bk_reply *out) {
    uint8_t hi, lo;
    const uint8_t *p;
    enum bk_decode_error e;
    if ((e = u8(r, &hi)) != BK_DECODED || (e = u8(r, &lo)) != BK_DECODED) return e;
    size_t n = (size_t)hi << 8 | lo;
    if (n > BK_MAX_SECRET) return BK_TOO_LONG;
    if ((e = take(r, n, &p)) != BK_DECODED) return e;
    memcpy(out->secret, p, n);
    out->secret[n] = 0;
    out->secret_length = n;
    return BK_DECODED;
}

#define TRY(x) do { enum bk_decode_error e_ = (x); if (e_ != BK_DECODED) return e_; } while (0)

static enum bk_decode_error body(struct reader *r, struct bk_reply *out) {
    switch (out->kind) {
    case BK_PROMPT:
        TRY(text(r, out->text[0])); TRY(text(r, out->text[1])); TRY(text(r, out->text[2]));
        return u32(r, &out->number);
    case BK_NOT_OFFERED: case BK_ERROR:
        return text(r, out->text[0]);
    case BK_PUSH:
        TRY(text(r, out->text[0]));
        TRY(secret(r, out));
        if (!out->text[0][0] || out->secret_length == 0 || memchr(out->secret, 0, out->secret_length)) return BK_INVALID_TEXT;
        return text(r, out->text[1]);
    case BK_KEY_LOGIN: case BK_ESCROW_CAPTURE:
        TRY(text(r, out->text[0]));
        if (!out->text[0][0]) return BK_INVALID_TEXT;
        return text(r, out->text[1]);
    case BK_NO_PUSH: {
        uint8_t v;
        TRY(u8(r, &v));
        if (v > BK_NOTHING_YET) return BK_INVALID_VALUE;
        out->number = v;
        return BK_DECODED;
    }
    case BK_NOTHING_YET_NEW_CODE:
        TRY(text(r, out->text[0]));
        if (!out->text[0][0]) return BK_INVALID_TEXT;
        return u32(r, &out->number);
    case BK_OK:
        return BK_DECODED;
    default:
        return BK_UNKNOWN_TYPE;
    }
}

enum bk_decode_error bk_decode_reply(const uint8_t *bytes, size_t count, struct bk_reply *out) {
    memset(out, 0, sizeof *out);
    if (count > BK_MAX_FRAME) return BK_TOO_LONG;
    if (count < 2) return BK_TRUNCATED;
    if (bytes[0] != BK_WIRE_VERSION) return BK_UNSUPPORTED_VERSION;
    struct reader r = { bytes, count, 2 };
    out->kind = bytes[1];
    enum bk_decode_error e = body(&r, out);
    if (e == BK_DECODED && r.offset != r.count) e = BK_TRAILING_BYTES;
    if (e != BK_DECODED) bk_reply_wipe(out);
    return e;
}

void bk_reply_wipe(struct bk_reply *r) {
    explicit_bzero(r, sizeof *r);
}

const char *bk_decode_error_text(enum bk_decode_error e) {
    switch (e) {
    case BK_DECODED: return "decoded";
    case BK_TRUNCATED: return "truncated";
    case BK_TRAILING_BYTES: return "trailing bytes";
    case BK_UNSUPPORTED_VERSION: return "unsupported version";
    case BK_UNKNOWN_TYPE: return "unknown type";
    case BK_TOO_LONG: return "too long";
    case BK_INVALID_TEXT: return "invalid text";
    case BK_INVALID_VALUE: return "invalid value";
    }
    return "?";
}
