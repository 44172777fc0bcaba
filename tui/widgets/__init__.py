"""The dashboard's panels; each renders from a ``Snapshot`` in ``show()``."""
