"""What comes in: the input file's rows (CSV or JSONL), its encoding, its columns, the exclude list.

The lowest wing: it imports no other wing but ``screen`` (and the SDK's public names).
"""
