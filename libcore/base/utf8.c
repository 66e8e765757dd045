/* utf8.c — UTF-8 checks for text that leaves the program (answers, messages, names):
   what a byte-level token stream cuts or breaks is replaced, never passed on. */
#include "base/utf8.h"

#include <string.h>

#include "base/util.h"

/* the length of the valid sequence starting at s (n bytes left), 0 when invalid,
   -1 when it is cut short by the end */
static int seq_len(const unsigned char *s, size_t n) {
    int len = s[0] < 0x80                   ? 1
              : s[0] >= 0xc2 && s[0] < 0xe0 ? 2
              : s[0] >= 0xe0 && s[0] < 0xf0 ? 3
              : s[0] >= 0xf0 && s[0] < 0xf5 ? 4
                                            : 0;
    for (int i = 1; i < len; i++) {
        if ((size_t)i >= n) return -1;
        if ((s[i] & 0xc0) != 0x80) return 0;
        /* overlong three- and four-byte forms, surrogates, and code points past U+10FFFF */
        if (i == 1 && ((s[0] == 0xe0 && s[1] < 0xa0) || (s[0] == 0xed && s[1] > 0x9f) ||
                       (s[0] == 0xf0 && s[1] < 0x90) || (s[0] == 0xf4 && s[1] > 0x8f)))
            return 0;
    }
    return len;
}

size_t utf8_count(const char *s, size_t n, size_t *from, size_t at) {
    size_t i = *from, chars = 0;
    for (; i < at && i < n; chars++) {
        int k = seq_len((const unsigned char *)s + i, n - i);
        i += k > 0 ? (size_t)k : 1; /* an invalid or cut byte is one U+FFFD */
    }
    *from = i;
    return chars;
}

size_t utf8_whole(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        int k = seq_len((const unsigned char *)s + i, n - i);
        if (k < 0) return i;
        i += k ? (size_t)k : 1; /* an invalid byte is whole: it becomes U+FFFD */
    }
    return n;
}

char *utf8_clean(const char *s, size_t n, size_t *out_n) {
    char *o = pd_alloc(pd_mul(n, 3) + 1), *p = o;
    if (!o) return NULL;
    for (size_t i = 0; i < n;) {
        int k = seq_len((const unsigned char *)s + i, n - i);
        if (k > 0) memcpy(p, s + i, k), p += k, i += k;
        else memcpy(p, "\xef\xbf\xbd", 3), p += 3, i++;
    }
    *p = 0;
    *out_n = p - o;
    return o;
}
