#!/usr/bin/env python3
"""pty_chat.py — drives `decode -cnv` through a pseudo-terminal, as a person at a terminal
would: it waits for the "> " prompt, types a turn, reads the answer up to the next prompt.

  python3 tests/pty_chat.py STDERR_FILE STEP... -- COMMAND ARGS...
  steps:  turn:TEXT       type TEXT and Enter; the answer is what comes before the next "> "
          interrupt:TEXT  the same, but Ctrl-C once the answer has begun (16 bytes of it)
          eof             Ctrl-D at the prompt, then wait for the exit
          sigint          Ctrl-C at the prompt, then wait for the exit

Prints one JSON object: {"answers": [...], "rc": exit status or null, "error": null or why}.
The terminal keeps its line discipline (Ctrl-C is SIGINT, Ctrl-D ends a line read) but
echo and output processing are off, so the answers read back are the bytes written.
Every wait is bounded (TIMEOUT seconds in all); past it the child is killed."""
import json
import os
import pty
import select
import signal
import sys
import termios
import time

TIMEOUT = 60.0


def main():
    err_file, rest = sys.argv[1], sys.argv[2:]
    cut = rest.index("--")
    steps, cmd = rest[:cut], rest[cut + 1:]
    pid, fd = pty.fork()
    if pid == 0:  # the child: the pty is its controlling terminal, stderr goes to the file
        attrs = termios.tcgetattr(0)
        attrs[1] &= ~termios.OPOST
        attrs[3] &= ~(termios.ECHO | termios.ECHOCTL)
        termios.tcsetattr(0, termios.TCSANOW, attrs)
        e = os.open(err_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(e, 2)
        os.execvp(cmd[0], cmd)
    deadline = time.monotonic() + TIMEOUT
    buf = b""
    out = {"answers": [], "rc": None, "error": None}

    def read_some():
        nonlocal buf
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out; the terminal shows: %r" % buf[-200:])
        r, _, _ = select.select([fd], [], [], min(left, 1.0))
        if r:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: the child closed the terminal
                chunk = b""
            if not chunk:
                raise EOFError("the program ended; the terminal shows: %r" % buf[-200:])
            buf += chunk

    def wait_prompt():  # "> " alone or after a newline, and nothing more for 0.2 s
        nonlocal buf
        while True:
            while not (buf == b"> " or buf.endswith(b"\n> ")):
                read_some()
            if not select.select([fd], [], [], 0.2)[0]:
                break
            read_some()
        before = buf[:-2]
        buf = b""
        return before

    try:
        wait_prompt()  # the first prompt (after the answer to -p, if any)
        for i, step in enumerate(steps):
            kind, _, text = step.partition(":")
            if kind in ("turn", "interrupt"):
                os.write(fd, text.encode() + b"\n")
                if kind == "interrupt":
                    while len(buf) < 16:
                        read_some()
                    os.write(fd, b"\x03")
                answer = wait_prompt()
                if not answer.endswith(b"\n"):
                    raise ValueError("answer %d does not end with a newline: %r" % (i, answer[-80:]))
                out["answers"].append(answer[:-1].decode("utf-8", "replace"))
            elif kind in ("eof", "sigint"):
                os.write(fd, b"\x04" if kind == "eof" else b"\x03")
                try:
                    while True:
                        read_some()
                except EOFError:
                    pass
                break
            else:
                raise ValueError("unknown step " + step)
        t_end = time.monotonic() + 10
        while time.monotonic() < t_end:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                out["rc"] = os.waitstatus_to_exitcode(status)
                break
            time.sleep(0.05)
        else:
            raise TimeoutError("the program did not exit")
    except (TimeoutError, EOFError, ValueError) as e:
        out["error"] = str(e)
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except OSError:
            pass
    print(json.dumps(out))


if __name__ == "__main__":
    main()
