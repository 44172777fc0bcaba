"""bsmon in the frameworks people train with: ``bsmon.probes.integrations.lightning``
(a Lightning callback) and ``bsmon.probes.integrations.hf`` (a Hugging Face ``TrainerCallback``).

Each is an optional extra (``pip install 'bsmon[lightning]'``, ``'bsmon[hf]'``); importing one
without its framework raises an ImportError that says what to install. See docs/integrations.md.
"""
