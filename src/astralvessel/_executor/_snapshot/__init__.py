"""A turn's state as a value: its files, their manifest, and the saved form.

``_manifest`` holds the values (``Entry``, ``Manifest``) and every rule a name,
a link or a size must keep; ``_tree`` scans a host folder into a manifest;
``_tar`` writes and strictly reads the tar format's headers; ``_archive`` writes
the saved form and reads it back, every member checked against the manifest
before a file is written.
"""
