/* test_chat — chat formats: recognised from real templates, and rendered to the token
   ids Meta documents for Llama 3's instruct format. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/chat.h"
#include "check.h"
#include "fixture.h"
#include "base/util.h"
#include "tokenizer/tokenizer.h"

/* tokenizer_config.json's chat_template, the Llama 3 one in shared data */
static char *llama3_template(void) {
    const char *path = test_data("Llama 3's own template", "tokenizers/llama3/tokenizer_config.json");
    char *json;
    size_t n;
    if (!path) return NULL;
    if (pd_read_file(path, &json, &n)) {
        CHECK(0, "%s", pd_errmsg());
        return NULL;
    }
    char *a = strstr(json, "\"chat_template\": \"");
    char *out = a ? strndup(a + 18, 400) : NULL;
    free(json);
    CHECK(out, "%s: no chat_template", path);
    return out;
}

static void test_detect(void) {
    char *l3 = llama3_template();
    if (l3) CHECK(chat_format_detect(l3) == CHAT_LLAMA3, "Llama 3's own template");
    /* SmolLM2's template, as its GGUF carries it (the start of it) */
    const char *smol =
        "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
        "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
        "{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}";
    CHECK(chat_format_detect(smol) == CHAT_CHATML, "SmolLM2's template");
    CHECK(chat_format_detect("{{ bos_token }}[INST] {{ message }} [/INST]") == CHAT_LLAMA2, "[INST]");
    CHECK(chat_format_detect("{{ message }}") == -1 && strstr(pd_errmsg(), "--chat-format"),
          "unknown template refused");
    CHECK(chat_format_detect(NULL) == -1, "no template refused");
    CHECK(chat_format_parse("llama3") == CHAT_LLAMA3 && chat_format_parse("vicuna") == -1, "names");
    int bos;
    char *t = chat_apply(CHAT_CHATML, smol, NULL, "Hi", &bos);
    CHECK(t &&
              !strcmp(
                  t,
                  "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
                  "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"),
          "ChatML with SmolLM2's default system prompt: %s", t);
    free(t);
    t = chat_apply(CHAT_LLAMA2, NULL, "Be brief.", "Hi", &bos);
    CHECK(t && bos && !strcmp(t, "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST]"), "Llama 2 format: %s", t);
    free(t);
    free(l3);
}

/* conversations, as the formats' owners document them: Meta's Llama 2 prompt
   ("<s>[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user_1} [/INST] {answer_1} </s><s>[INST]
   {user_2} [/INST]"), Llama 3's header/eot turns, and ChatML's im_start/im_end turns */
static void test_turns(void) {
    ChatTurn t[4] = {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", "Bye"}};
    int bos;
    char *s = chat_apply_turns(CHAT_LLAMA2, NULL, t, 4, &bos);
    CHECK(s && bos && !strcmp(s, "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello. </s><s>[INST] Bye [/INST]"),
          "Llama 2 conversation: %s", s);
    free(s);
    s = chat_apply_turns(CHAT_LLAMA3, NULL, t + 1, 3, &bos);
    CHECK(s && !bos &&
              !strcmp(s, "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                         "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
                         "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
                         "<|start_header_id|>assistant<|end_header_id|>\n\n"),
          "Llama 3 conversation: %s", s);
    free(s);
    s = chat_apply_turns(CHAT_CHATML, NULL, t, 4, &bos);
    CHECK(s && !strcmp(
                   s,
                   "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                   "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"),
          "ChatML conversation: %s", s);
    free(s);
    /* Llama 2 trims as the Hugging Face template does: content.strip() per turn, the system
       prompt and the first user turn as one ('[INST] ' + content.strip() + ' [/INST]',
       ' ' + content.strip() + ' ' + eos_token) */
    ChatTurn ws[4] = {{"system", " Be brief. "}, {"user", " Hi \n"}, {"assistant", " Hello. "}, {"user", "Bye "}};
    s = chat_apply_turns(CHAT_LLAMA2, NULL, ws, 4, &bos);
    CHECK(s && bos &&
              !strcmp(s, "[INST] <<SYS>>\n Be brief. \n<</SYS>>\n\n Hi [/INST] Hello. </s><s>[INST] Bye [/INST]"),
          "Llama 2 trims the turns: %s", s);
    free(s);
    ChatTurn bad = {"tool", "x"};
    CHECK(!chat_apply_turns(CHAT_CHATML, NULL, &bad, 1, &bos) && strstr(pd_errmsg(), "role 'tool'"),
          "unknown role refused");
}

/* Meta's model card: <|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n...
   = 128000 128006 882 128007 271 ... 128009 128006 78191 128007 271 */
static void test_llama3_ids(void) {
    const char *path = test_data("Llama 3's header ids", "tokenizers/llama3/tokenizer.json.gz");
    Tokenizer *t;
    if (!path) return;
    if (tok_load_file(&t, path)) {
        CHECK(0, "%s", pd_errmsg());
        return;
    }
    int bos, n;
    int32_t *ids;
    char *text = chat_apply(CHAT_LLAMA3, NULL, NULL, "  Hello!\n", &bos);
    CHECK(text && !bos, "llama3 text");
    CHECK(tok_encode_flags(t, text, strlen(text), TOK_SPECIAL, &ids, &n) == 0, "%s", pd_errmsg());
    const int head[] = {128000, 128006, 882, 128007, 271}, tail[] = {128009, 128006, 78191, 128007, 271};
    CHECK(n == 5 + 2 + 5, "token count %d (Hello ! trimmed)", n);
    CHECK(n >= 10 && !memcmp(ids, head, sizeof head) && !memcmp(ids + n - 5, tail, sizeof tail), "Llama 3 header ids");
    free(ids);
    free(text);
    tok_free(t);
}

int main(void) {
    test_detect();
    test_turns();
    test_llama3_ids();
    return check_done("chat");
}
