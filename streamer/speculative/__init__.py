"""Speculative decoding on a streamed model: several tokens per expert read and per host sync.

A drafter (a small resident draft model, or prompt lookup) proposes k tokens; the streamed target
verifies them with the last token in one forward pass of k+1 inputs, which syncs once per MoE
layer and reads each routed expert once for every input routed to it; the drafts it agrees with
are kept. Greedy output is exactly plain decoding's (tests/test_speculative.py).
"""
