"""What prefix caching is, in plain PyTorch and Python: block hashes, the block pool with vLLM V1's
contract, the radix tree (the upper bound), the paged mini-engine, and the lab's own local model.
Imports nothing else from lab."""
