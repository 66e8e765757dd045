"""serve_openai.py — bin/serve driven by the official openai client (tests/test_serve_openai.sh
starts the server): completions and chat, streams with and without include_usage, n,
logprobs and top_logprobs, echo, prompt arrays and token ids, the developer role,
multi-part content, max_tokens 0, and unsupported fields refused as BadRequestError naming
them; /v1/models with the --alias name, and the --api-key (the server runs with both). Logprobs are checked against numpy's log-softmax of bin/decode --dump-logits (an
independent path: one prefill by the decode tool), and every lossless method must give
standard's numbers to the bit.
usage: serve_openai.py PORT MODEL BIN TMP METHODS..."""
import os
import subprocess
import sys

import numpy as np
import openai

PORT, MODEL, BIN, TMP = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
METHODS = sys.argv[5:]
TOKENIZER = os.environ.get("TOKENIZER")  # the model's tokenizer file, for bin/tokenize
URL = f"http://127.0.0.1:{PORT}/v1"
client = openai.OpenAI(base_url=URL, api_key="sekret", max_retries=0, timeout=120)
passed = failed = 0


def check(what, ok):
    global passed, failed
    if ok:
        passed += 1
    else:
        failed += 1
        print(f"FAIL: {what}")


def reference(prompt, chat=False, system=None):
    """the log-softmax after the prompt, from bin/decode's own prefill (float64)"""
    out = f"{TMP}/logits.f32"
    cmd = [f"{BIN}/decode", "-m", MODEL, "-p", prompt, "-n", "1", "--dump-logits", out]
    if chat:
        cmd += ["--chat", "--chat-format", "chatml"] + (["--system", system] if system else [])
    # (its --dump-logits exit frees nothing, which the sanitizer build would call a leak)
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0")
    subprocess.run(cmd, check=True, capture_output=True, env=env)
    x = np.fromfile(out, dtype=np.float32).astype(np.float64)
    m = x.max()
    return x - m - np.log(np.exp(x - m).sum())


def bad_request(what, name, call):
    try:
        call()
        check(f"{what}: refused", False)
    except openai.BadRequestError as e:  # the client keeps the answer's error object as body
        msg = e.body.get("message", "") if isinstance(e.body, dict) else ""
        check(f"{what}: BadRequestError naming '{name}' ({msg or e.message})", f"'{name}'" in msg)


def completions():
    r = client.completions.create(model="m", prompt="Once upon a time", max_tokens=20, temperature=0)
    c = r.choices[0]
    check("completion: one choice with text, finish_reason length",
          len(r.choices) == 1 and c.text and c.finish_reason == "length" and c.index == 0)
    check("completion: usage", r.usage.completion_tokens == 20 and r.usage.total_tokens == 20 + r.usage.prompt_tokens)
    check("completion: the object and id", r.object == "text_completion" and r.id.startswith("cmpl"))
    # streaming: the same text; usage only when asked, in its own last chunk
    chunks = list(client.completions.create(model="m", prompt="Once upon a time", max_tokens=20, temperature=0, stream=True))
    check("stream: the chunks' text = the answer", "".join(k.choices[0].text for k in chunks if k.choices) == c.text)
    check("stream without include_usage: no usage at all", all(k.usage is None for k in chunks))
    chunks = list(client.completions.create(model="m", prompt="Once upon a time", max_tokens=20, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    last = chunks[-1]
    check("stream with include_usage: the last chunk has no choices and the usage",
          last.choices == [] and last.usage and last.usage.completion_tokens == 20)
    check("stream with include_usage: the others have none", all(k.usage is None for k in chunks[:-1]))
    # n: choice i is the request with seed + i; greedy choices are equal
    r = client.completions.create(model="m", prompt="Tom", max_tokens=12, temperature=1, seed=11, n=3)
    check("n = 3: three choices, indices 0..2", [c.index for c in r.choices] == [0, 1, 2])
    for i in range(3):
        one = client.completions.create(model="m", prompt="Tom", max_tokens=12, temperature=1, seed=11 + i)
        check(f"n = 3: choice {i} = the request with seed {11 + i}", one.choices[0].text == r.choices[i].text)
    check("n = 3: sampled choices differ", len({c.text for c in r.choices}) > 1)
    r = client.completions.create(model="m", prompt="Tom", max_tokens=12, temperature=0, n=2)
    check("greedy n = 2: equal choices", r.choices[0].text == r.choices[1].text)
    # prompts: an array of strings, token ids, arrays of token ids
    r = client.completions.create(model="m", prompt=["Once upon a time", "Tom"], max_tokens=8, temperature=0, n=2)
    alone = client.completions.create(model="m", prompt="Tom", max_tokens=8, temperature=0)
    check("prompt array: prompts × n choices, index = prompt × n + i",
          [c.index for c in r.choices] == [0, 1, 2, 3] and r.choices[2].text == alone.choices[0].text)
    echo = client.completions.create(model="m", prompt="Tom", max_tokens=0, echo=True, logprobs=0)
    r0 = client.completions.create(model="m", prompt="Once upon a time", max_tokens=8, temperature=0, logprobs=0, echo=True)
    ids = None  # the prompt's ids from bin/tokenize, on the model's own tokenizer file
    if TOKENIZER:
        out = subprocess.run([f"{BIN}/tokenize", "--tokenizer", TOKENIZER, "--bos"], input="Once upon a time",
                             capture_output=True, text=True)
        ids = [int(t) for t in out.stdout.split()] if out.returncode == 0 else None
        check("bin/tokenize gives the prompt's ids", bool(ids))
    else:
        print("serve_openai: no tokenizer file (TOKENIZER): token-id prompts not checked")
    if ids:
        r = client.completions.create(model="m", prompt=ids, max_tokens=8, temperature=0)
        check("a prompt of token ids says what its text says", r.choices[0].text == r0.choices[0].text[len("Once upon a time"):])
        r = client.completions.create(model="m", prompt=[ids, ids[:2]], max_tokens=8, temperature=0)
        check("arrays of token ids: a choice each", len(r.choices) == 2 and r.choices[0].text == r0.choices[0].text[len("Once upon a time"):])
        bad_request("a token id outside the vocabulary", "prompt",
                    lambda: client.completions.create(model="m", prompt=[1, 100000], max_tokens=2))
    # echo, and max_tokens 0
    check("echo: the prompt, then the answer", r0.choices[0].text.startswith("Once upon a time") and
          len(r0.choices[0].text) > len("Once upon a time"))
    check("echo with logprobs: the first token has none",
          r0.choices[0].logprobs.token_logprobs[0] is None and r0.choices[0].logprobs.top_logprobs[0] is None)
    check("max_tokens 0: no tokens, finish_reason length, the echo",
          echo.choices[0].text == "Tom" and echo.choices[0].finish_reason == "length" and echo.usage.completion_tokens == 0)
    # unsupported fields
    bad_request("best_of 2", "best_of", lambda: client.completions.create(model="m", prompt="a", best_of=2, n=1))
    bad_request("suffix", "suffix", lambda: client.completions.create(model="m", prompt="a", suffix="end"))
    bad_request("presence_penalty", "presence_penalty", lambda: client.completions.create(model="m", prompt="a", presence_penalty=1))
    bad_request("logit_bias", "logit_bias", lambda: client.completions.create(model="m", prompt="a", logit_bias={"5": 10}))
    bad_request("an unknown field", "mirostat", lambda: client.completions.create(model="m", prompt="a", extra_body={"mirostat": 2}))
    bad_request("logprobs 6", "logprobs", lambda: client.completions.create(model="m", prompt="a", logprobs=6))
    ok = client.completions.create(model="m", prompt="a", max_tokens=2, user="me", presence_penalty=0, frequency_penalty=0,
                                   best_of=1, logit_bias={}, n=1, seed=3)
    check("fields that ask for nothing are accepted", len(ok.choices) == 1)


def logprobs():
    prompt = "Once upon a time, there was a little girl"
    ref = reference(prompt)
    r = client.completions.create(model="m", prompt=prompt, max_tokens=30, temperature=0, logprobs=5)
    lp = r.choices[0].logprobs
    first = int(np.argmax(ref))
    check(f"logprobs: the first token's = numpy's log-softmax of bin/decode's logits ({lp.token_logprobs[0]} vs {ref[first]})",
          abs(lp.token_logprobs[0] - ref[first]) < 1e-5)
    top = sorted(lp.top_logprobs[0].values(), reverse=True)
    want = np.sort(ref)[::-1][:5]
    check("logprobs: the first position's five best = numpy's", len(top) == 5 and np.allclose(top, want, atol=1e-5))
    check("logprobs: one per token, offsets rising",
          len(lp.tokens) == 30 and len(lp.token_logprobs) == 30 and lp.text_offset == sorted(lp.text_offset))
    check("logprobs: the tokens spell the text", "".join(lp.tokens) == r.choices[0].text)
    for m in METHODS:  # lossless: the very same numbers
        o = client.completions.create(model="m", prompt=prompt, max_tokens=30, temperature=0, logprobs=5, extra_body={"method": m})
        check(f"logprobs: {m} = standard, bit for bit", o.choices[0].logprobs.token_logprobs == lp.token_logprobs and
              o.choices[0].logprobs.top_logprobs == lp.top_logprobs and o.choices[0].text == r.choices[0].text)
    # the same in a stream
    chunks = list(client.completions.create(model="m", prompt=prompt, max_tokens=30, temperature=0, logprobs=5, stream=True))
    got = [v for k in chunks if k.choices and k.choices[0].logprobs for v in k.choices[0].logprobs.token_logprobs]
    check("stream: the chunks' logprobs = the answer's", got == lp.token_logprobs)
    # chat: logprobs true, top_logprobs
    msgs = [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Tell a story."}]
    ref = reference("Tell a story.", chat=True, system="Be kind.")
    r = client.chat.completions.create(model="m", messages=msgs, max_tokens=20, temperature=0, logprobs=True, top_logprobs=5)
    content = r.choices[0].logprobs.content
    first = int(np.argmax(ref))
    check(f"chat logprobs: the first token's = numpy's ({content[0].logprob} vs {ref[first]})", abs(content[0].logprob - ref[first]) < 1e-5)
    check("chat logprobs: token, bytes, five alternatives best first",
          len(content) == 20 and all(len(t.top_logprobs) == 5 for t in content) and
          all(t.bytes == list(t.token.encode()) for t in content) and
          np.allclose([a.logprob for a in content[0].top_logprobs], np.sort(ref)[::-1][:5], atol=1e-5))
    for m in METHODS:
        o = client.chat.completions.create(model="m", messages=msgs, max_tokens=20, temperature=0, logprobs=True, top_logprobs=5,
                                           extra_body={"method": m})
        check(f"chat logprobs: {m} = standard, bit for bit", o.choices[0].logprobs == r.choices[0].logprobs)
    r = client.chat.completions.create(model="m", messages=msgs, max_tokens=5, logprobs=True)
    check("chat logprobs without top_logprobs: no alternatives", all(t.top_logprobs == [] for t in r.choices[0].logprobs.content))
    bad_request("top_logprobs 21", "top_logprobs",
                lambda: client.chat.completions.create(model="m", messages=msgs, logprobs=True, top_logprobs=21))
    bad_request("top_logprobs without logprobs", "top_logprobs",
                lambda: client.chat.completions.create(model="m", messages=msgs, top_logprobs=2))


def chat():
    msgs = [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Tell a story."}]
    r = client.chat.completions.create(model="m", messages=msgs, max_tokens=16, temperature=0)
    m = r.choices[0].message
    check("chat: an assistant message", r.object == "chat.completion" and m.role == "assistant" and m.content)
    chunks = list(client.chat.completions.create(model="m", messages=msgs, max_tokens=16, temperature=0, stream=True))
    check("chat stream: the first delta has the role, the rest the text",
          chunks[0].choices[0].delta.role == "assistant" and
          "".join(k.choices[0].delta.content or "" for k in chunks if k.choices) == m.content)
    check("chat stream without include_usage: no usage", all(k.usage is None for k in chunks))
    chunks = list(client.chat.completions.create(model="m", messages=msgs, max_tokens=16, temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    check("chat stream with include_usage: its own last chunk", chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 16)
    dev = client.chat.completions.create(model="m", messages=[{"role": "developer", "content": "Be kind."}, msgs[1]], max_tokens=16,
                                         temperature=0)
    check("the developer role is the system's", dev.choices[0].message.content == m.content)
    parts = [{"role": "system", "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "kind."}]},
             {"role": "user", "content": [{"type": "text", "text": "Tell "}, {"type": "text", "text": "a "},
                                          {"type": "text", "text": "story."}]}]
    r2 = client.chat.completions.create(model="m", messages=parts, max_tokens=16, temperature=0)
    check("multi-part text content = the joined string", r2.choices[0].message.content == m.content)
    r = client.chat.completions.create(model="m", messages=msgs, max_tokens=8, temperature=1, seed=5, n=3)
    check("chat n = 3", [c.index for c in r.choices] == [0, 1, 2])
    bad_request("an image part", "image_url", lambda: client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]))
    bad_request("tools", "tools", lambda: client.chat.completions.create(
        model="m", messages=msgs, tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}]))
    bad_request("tool_choice", "tool_choice", lambda: client.chat.completions.create(model="m", messages=msgs, tool_choice="required"))
    bad_request("response_format json", "response_format",
                lambda: client.chat.completions.create(model="m", messages=msgs, response_format={"type": "json_object"}))
    bad_request("frequency_penalty", "frequency_penalty",
                lambda: client.chat.completions.create(model="m", messages=msgs, frequency_penalty=0.5))
    bad_request("max_tokens 0", "max_tokens", lambda: client.chat.completions.create(model="m", messages=msgs, max_tokens=0))
    ok = client.chat.completions.create(model="m", messages=msgs, max_tokens=2, user="me", response_format={"type": "text"},
                                        tools=[], n=1, seed=1, stream_options=None)
    check("chat fields that ask for nothing are accepted", len(ok.choices) == 1)


def server():
    ids = [m.id for m in client.models.list().data]
    check(f"models.list: the one model, by its --alias ({ids})", ids == ["paradec-test"])
    m = client.models.retrieve("paradec-test")
    check("models.retrieve: the model object", m.id == "paradec-test" and m.object == "model" and m.owned_by)
    try:
        client.models.retrieve("another")
        check("models.retrieve of another id: NotFoundError", False)
    except openai.NotFoundError:
        check("models.retrieve of another id: NotFoundError", True)
    r = client.completions.create(model="paradec-test", prompt="Once", max_tokens=2, temperature=0)
    check(f"answers name the --alias ({r.model})", r.model == "paradec-test")
    r2 = client.completions.create(model="paradec-test", prompt="Once", max_tokens=2, temperature=0)
    check("ids differ between requests", r.id != r2.id)
    for key in ("wrong", None):
        other = openai.OpenAI(base_url=URL, api_key=key or "", max_retries=0, timeout=30)
        try:
            other.completions.create(model="m", prompt="Once", max_tokens=2)
            check(f"api key {key!r}: AuthenticationError", False)
        except openai.AuthenticationError:
            check(f"api key {key!r}: AuthenticationError", True)


server()
completions()
logprobs()
chat()
print(f"serve_openai (openai {openai.__version__}): {passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
