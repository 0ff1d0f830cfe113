"""What a person sees: progress, counts in words, failures told by cause, advice, the one error.

Imported by every wing; it imports none of them (only the SDK's public names).
"""
