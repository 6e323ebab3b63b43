"""The pass engine: token rows streamed once, validated, chunked by whole sequences and fed to mergeable consumers (the accumulator contract, the core numba kernels, threads)."""
