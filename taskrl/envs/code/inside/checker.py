"""Runs a HumanEval ``check`` against the agent's function, in a sandbox of its own (trusted harness script).

``python -I checker.py PROGRAM_FD VERDICT_FD``: reads the problem's prompt and test from PROGRAM_FD, calls
``check(candidate)`` where ``candidate`` forwards each call over stdin/stdout to ``candidate.py`` in the
agent's sandbox, and writes one JSON verdict to VERDICT_FD. Results arrive as plain data, so every comparison
in the test is between built-in values: a returned object cannot rig ``__eq__``.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wire  # noqa: E402

del sys.path[0]


class CandidateError(Exception):
    """The agent's function raised, returned something that is not plain data, or its process ended."""


REPLY_KEYS = ({"ok"}, {"error"}, {"error", "rigged_eq"})


def harness_reply(line: bytes) -> dict | None:
    """The reply as ``candidate.py`` writes it (one JSON object per line, with those keys only), else None."""
    if not line.endswith(b"\n"):
        return None
    try:
        reply = json.loads(line)
    except ValueError:
        return None
    if type(reply) is not dict or set(reply) not in REPLY_KEYS:
        return None
    if "rigged_eq" in reply and type(reply["rigged_eq"]) is not bool:
        return None
    return reply


def main() -> None:
    with os.fdopen(int(sys.argv[1]), "rb") as f:
        program = json.loads(f.read())
    verdict = os.fdopen(int(sys.argv[2]), "w")
    requests = os.fdopen(os.dup(1), "wb")
    replies = os.fdopen(os.dup(0), "rb")
    os.dup2(2, 1)

    def candidate(*args, **kwargs):  # type: ignore[no-untyped-def]
        if kwargs:
            raise CandidateError("keyword arguments are not forwarded")
        try:
            requests.write(json.dumps({"args": wire.encode(list(args))}).encode() + b"\n")
            requests.flush()
        except BrokenPipeError:  # the solution's process already ended: still read what it left on the pipe
            pass
        line = replies.readline()
        if not line:
            raise CandidateError("the solution's process ended")
        reply = harness_reply(line)
        if reply is None:  # candidate.py writes only these; anything else came from the agent's code
            forged.append(repr(line[:100]))
            raise CandidateError("the reply pipe carried a message the harness did not write")
        if reply.get("rigged_eq"):
            rigged.append(str(reply["error"])[:200])
        if "error" in reply:
            raise CandidateError(reply["error"])
        return wire.decode(reply["ok"])

    rigged: list[str] = []
    forged: list[str] = []
    scope: dict = {"__name__": "__check__"}
    try:
        exec(compile(program["prompt"], "prompt.py", "exec"), scope)  # helpers the test uses (e.g. poly)
        scope[program["entry_point"]] = candidate  # tests that call the function by name (HumanEval/33)
        exec(compile(program["test"], "test.py", "exec"), scope)
        scope["check"](candidate)
        result = {"passed": True, "message": ""}
    except AssertionError as e:
        result = {"passed": False, "message": f"AssertionError: {e}"[:300] if str(e) else "AssertionError"}
    except CandidateError as e:
        result = {"passed": False, "message": f"the solution failed: {e}"[:300]}
    except BaseException as e:  # noqa: BLE001
        result = {"passed": False, "message": f"{type(e).__name__}: {e}"[:300]}
    tampering = []
    if rigged:  # an object that defines its own equality, returned where a plain value was expected
        tampering.append(f"returned an object with its own __eq__: {rigged[0]}")
    if forged:
        tampering.append(f"the solution wrote to the harness's reply pipe: {forged[0]}")
    if tampering:
        result["tampering"] = tampering
    verdict.write(json.dumps(result))
    verdict.close()


if __name__ == "__main__":
    main()
