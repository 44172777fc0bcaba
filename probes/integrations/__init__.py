"""bsmon in the frameworks people train with.

Modules, one job each:

- ``lightning``: a Lightning callback (``bsmon.probes.integrations.lightning``);
- ``hf``: a Hugging Face ``TrainerCallback`` (``bsmon.probes.integrations.hf``);
- ``common``: what ``bsmon run`` and the framework integrations share.

Each is an optional extra (``pip install 'bsmon[lightning]'``, ``'bsmon[hf]'``); importing one
without its framework raises an ImportError that says what to install. See docs/integrations.md.
"""
