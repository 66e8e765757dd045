/* utf8.h — valid UTF-8 out of any bytes: an invalid byte becomes U+FFFD. */
#ifndef PD_UTF8_H
#define PD_UTF8_H
#include <stddef.h>

/* streamed text is cut into UTF-8 a token at a time: how much of s[0..n) is whole
   characters (a sequence cut at the end waits for the next token) */
size_t utf8_whole(const char *s, size_t n);
/* s[0..n) with every byte that is not valid UTF-8 replaced by U+FFFD (malloc'd) */
char *utf8_clean(const char *s, size_t n, size_t *out_n);
/* how many characters utf8_clean makes of the sequences of s[0..n) that start in
   [*from, at); *from (a sequence's start) moves on past them: a text offset in
   characters, counted on from where the last one ended */
size_t utf8_count(const char *s, size_t n, size_t *from, size_t at);

#endif
