"""EGG's compiler: captured op graph -> rewrites -> fusion groups -> ModelNew source.

ops: what each torch op is (pointwise / reduction / softmax / view / library) and its Triton
expression; fusion: grouping into kernels; rewrites: algebraic rules; emit: the ModelNew file.
"""
