"""Task-set generation: verified multi-hop retrieval tasks over a corpus (``multihop``) and bug-injected code
tasks (``codebugs``).

Generated tasks are plain ``taskrl.types.Task`` rows in JSONL; every kept task passed its generator's
verification, and dropped ones are counted by reason. ``taskrl datagen ...`` runs the generators.
"""
