"""Serves the agent's function to the HumanEval checker, inside the agent's sandbox (trusted harness script).

``python -I candidate.py ENTRY_POINT``: stdin/stdout are pipes to the checker, which runs in another sandbox
with the hidden tests; this process never sees them. Each request line is a call's arguments, each reply the
return value as plain data (``wire.encode``) or the exception it raised. The solution's own prints go to
stderr, so they cannot corrupt the protocol.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wire  # noqa: E402

del sys.path[0]


def main() -> None:
    entry = sys.argv[1]
    requests = os.fdopen(os.dup(0), "rb")
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # print() in the solution goes to stderr
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    sys.path.append(os.getcwd())  # last: the workspace cannot shadow the standard library
    try:
        import solution

        function = getattr(solution, entry)
    except BaseException as e:  # noqa: BLE001 - whatever the agent's module does, the checker must hear of it
        replies.write(json.dumps({"error": f"importing solution.{entry}: {type(e).__name__}: {e}"[:500]}).encode())
        replies.write(b"\n")
        replies.flush()
        return
    for line in requests:
        args = wire.decode(json.loads(line)["args"])
        try:
            result = function(*args)
        except BaseException as e:  # noqa: BLE001
            reply = {"error": f"{type(e).__name__}: {e}"[:500]}
        else:
            try:
                reply = {"ok": wire.encode(result)}
            except wire.WireError as e:
                reply = {"error": f"WireError: {e}"[:500], "rigged_eq": rigged_equality(result)}
        replies.write(json.dumps(reply).encode() + b"\n")
        replies.flush()


def rigged_equality(value: object) -> bool:
    """Whether a returned object defines its own comparison (the always-equal hack), not a plain mistake."""
    try:
        return any(
            str(klass.__module__).split(".")[0] not in sys.stdlib_module_names
            and any(n in vars(klass) for n in ("__eq__", "__ne__"))
            for klass in type(value).__mro__
        )
    except Exception:  # noqa: BLE001
        return True


if __name__ == "__main__":
    main()
