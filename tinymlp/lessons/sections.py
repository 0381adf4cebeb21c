"""Where the lessons teach each exercise: the headings of its notebook above the exercise's answer
(the section, and the subsection when there is one), for the ``see:`` line of a failing check.

Written by lessons/make_lessons.py from lessons/src/: rebuild it there, do not edit it here.
"""

SECTIONS = {
    '01.1': ('1. One neuron and the chain rule',),
    '01.2': ('2. Checking a derivative with finite differences',),
    '02.1': ('3. Watching the engine: reverse topological order', 'Your own engine, in thirty lines'),
    '02.2': ('3. Watching the engine: reverse topological order', 'Your own engine, in thirty lines'),
    '02.3': ('5. Broadcasting and its adjoint',),
    '03.1': ('2. Linear',),
    '03.2': ('3. GELU',),
    '04.1': ('3. A LayerNorm `Function`',),
    '04.2': ('2. Backward, step by step',),
    '05.1': ('1. Softmax', 'The Jacobian'),
    '05.2': ('1. Softmax', 'Softmax cross-entropy, derived from log-sum-exp'),
    '05.3': ('2. Scaled dot-product attention', 'The backward pass of attention'),
    '05.4': ('3. Sinusoidal position encodings', 'The encoding at $t + \\phi$ is a rotation of the encoding at $t$'),
    '06.1': ('1. Token mixing and channel mixing',),
    '06.2': ('1. Token mixing and channel mixing',),
    '06.3': ('2. Cost: linear in the number of tokens',),
    '07.1': ('1. At initialisation the gate is open and the tokens do not talk', 'The full backward pass of the SGU'),
    '07.2': ('4. The Toeplitz constraint', 'The Toeplitz backward'),
    '07.3': ('4. The Toeplitz constraint', 'The Toeplitz backward'),
    '08.1': ('4. Looking inside: where does the query look?',),
    '08.2': ('4. Looking inside: where does the query look?',),
    '10.1': ('2. RMSNorm as a `Function`',),
    '10.2': ('6. Swish',),
    '10.3': ('9. Your own layer',),
    '12.1': ('2. Embeddings and the backward of a lookup',),
    '12.2': ('1. Tokens', 'Mean pooling over the real tokens'),
    '12.3': ('1. Tokens',),
}
