"""The job over workers: the rows in Redis chunks, the producer, the workers, the report.

Imports ``job`` and ``reading`` below it and ``screen``; never the commands above it.
"""
