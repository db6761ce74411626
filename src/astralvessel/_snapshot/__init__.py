"""A turn's state as a value: its files, their manifest, and the saved form.

``_manifest`` holds the values (``Entry``, ``Manifest``) and every rule a name,
a link or a size must keep; ``_tree`` scans a host folder into a manifest;
``_archive`` writes the saved form (a POSIX pax tar) and reads it back, checked.
"""
