/* chat.h — wrapping a prompt in a model's chat format. No Jinja: the formats paradec
   knows are recognised in a model's chat_template by their markers, or named. */
#ifndef PD_CHAT_H
#define PD_CHAT_H

typedef enum { CHAT_LLAMA3, CHAT_LLAMA2, CHAT_CHATML, CHAT_COUNT } ChatFormat;

const char *chat_format_name(ChatFormat f); /* "llama3", "llama2", "chatml" */
const char *chat_format_names(void);        /* "llama3, llama2, chatml" */
int chat_format_parse(const char *name);    /* -1 + message when unknown */
/* the format a chat_template (Jinja text from tokenizer_config.json or GGUF) uses;
   -1 + message naming what was seen when it is not one paradec knows */
int chat_format_detect(const char *tmpl);
/* the text to encode (with special tokens recognised) for one user turn, ready for
   the assistant's answer. system may be NULL: then the template's own default system
   prompt, if it has one, is used. *add_bos says whether BOS must be added in front
   (the text does not carry it). malloc'd; NULL + message on failure. */
char *chat_apply(ChatFormat f, const char *tmpl, const char *system, const char *user, int *add_bos);
/* the same for a whole conversation: turns with role "system" (first only), "user" or
   "assistant", ready for the assistant's next answer */
typedef struct {
    const char *role, *content;
} ChatTurn;
char *chat_apply_turns(ChatFormat f, const char *tmpl, const ChatTurn *t, int n, int *add_bos);

#endif
