"""The command functions of ``taskrl train|demo|eval|datagen``, one module per command (group).

Convention: ``commands/<name>.py`` defines ``<name>_command`` (``datagen.py``: one per generator), a plain function
whose typer-annotated parameters are the options; it parses them, calls the library (``taskrl.training``,
``taskrl.eval``, ``taskrl.datagen``) and prints. ``taskrl.cli`` registers each with ``app.command(NAME)``. A
command never holds logic another caller needs: that lives in the library, below this package. Heavy libraries
(torch, transformers) load inside the command, so ``taskrl --help`` stays fast.
"""
