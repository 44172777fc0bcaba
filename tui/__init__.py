"""bsmon.tui: the Textual dashboard and the ``bsmon`` command line.

It talks to a training job only through the wire protocol (bsmon.probes.wire.protocol).
"""
