"""Small problems of every template family and of the failures of issue 16, for the drop-in
tests (tests/test_dropin.py) and their GPU run (scripts/gpu_dropin.py): no pytest here."""

HEAD = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"


def problem(init: str, forward: str, inputs: str, init_args: str = "[]") -> str:
    return (HEAD + "class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            + (init or "        pass\n") + forward
            + f"def get_inputs():\n    return {inputs}\n" + f"def get_init_inputs():\n    return {init_args}\n")


FAMILIES = {
    # name: (problem, template kinds the file must use, trials that must run the kernels)
    "pointwise": (problem(
        "        self.b = nn.Parameter(torch.randn(33))\n        self.s = nn.Parameter(torch.randn(1, 33))\n",
        "    def forward(self, x, y):\n"
        "        z = F.leaky_relu((x - 0.3) * 1.5 + self.b, 0.2) + y * self.s\n"
        "        return torch.where(z > 0.5, F.silu(z), torch.tanh(z)), F.gelu(y)\n",
        "[torch.randn(4, 33), torch.randn(4, 33)]"), {"pointwise"}, ["own", "x3", "batch", "rank"]),
    "reduction": (problem("",  # rows (innermost) and columns mappings, values and indices
        "    def forward(self, x):\n"
        "        return ((x * 2.0 - 1.0).sum(dim=-1), torch.mean(x, dim=1, keepdim=True) * 3.0,\n"
        "                torch.argmax(x, dim=1), x.max(dim=-1)[0] + 1.0)\n",
        "[torch.randn(3, 5, 7)]"), {"reduction"}, ["own", "neg", "batch", "rank"]),
    "softmax": (problem("        self.sm = nn.Softmax(dim=-1)\n",
        "    def forward(self, x, bias):\n"
        "        z = x + bias\n"
        "        return self.sm(z) * 0.5, torch.log_softmax(z * 2.0, dim=-1), torch.softmax(x, dim=1)\n",
        "[torch.randn(2, 3, 40), torch.randn(40)]"), {"softmax"}, ["own", "x100", "batch", "rank"]),
    # few long rows cut into chunks (the split softmax, forced by CONFIGS below)
    "softmax_split": (problem("",
        "    def forward(self, x):\n"
        "        return torch.softmax(x.float() / 0.7, dim=-1), torch.log_softmax(x * 2.0, dim=-1)\n",
        "[torch.randn(2, 3, 700)]"), {"softmax"}, ["own", "x100", "batch", "rank"]),
    "norms": (problem(
        "        self.ln = nn.LayerNorm(24)\n        self.rms = nn.RMSNorm(24)\n"
        "        self.gn = nn.GroupNorm(2, 4)\n        self.inorm = nn.InstanceNorm2d(4, affine=True)\n",
        "    def forward(self, x, img):\n"
        "        return F.relu(self.ln(x)), self.rms(x) * 2.0, self.gn(img), self.inorm(img) + 1.0\n",
        "[torch.randn(5, 24), torch.randn(2, 4, 3, 5)]"), {"norm"}, ["own", "x0.01", "batch"]),
    "batch_norm": (problem("        self.bn = nn.BatchNorm2d(2, momentum=0.3)\n",
        "    def forward(self, x):\n        return self.bn(torch.relu(x * 2.0))\n",
        "[torch.randn(3, 2, 3, 2)]"), {"chanstats", "pointwise"}, ["own", "batch"]),
    "batch_norm_1d": (problem("        self.bn = nn.BatchNorm1d(4)\n",  # statistics of (N, C): the cols kernel
        "    def forward(self, x):\n        return torch.tanh(self.bn(x) * 2.0)\n",
        "[torch.randn(6, 4)]"), {"chanstats"}, ["own", "batch"]),
    "training_branch": (problem("        self.drop = nn.Dropout(0.3)\n",  # a forward that reads self.training
        "    def forward(self, x):\n"
        "        y = torch.relu(x) * 2.0\n"
        "        if self.training:\n"
        "            y = y + 1.0\n"
        "        return self.drop(y) - 0.5\n",
        "[torch.randn(4, 9)]"), {"pointwise"}, ["own", "batch"]),
    "pool": (problem("        self.mp = nn.MaxPool2d(2)\n        self.ap = nn.AvgPool2d(3, stride=2, padding=1)\n",
        "    def forward(self, x):\n"
        "        return self.mp(torch.relu(x)) * 2.0, self.ap(x), F.max_pool1d(x.flatten(2), 3)\n",
        "[torch.randn(2, 3, 7, 5)]"), {"pool"}, ["own", "batch"]),
    "scan": (problem("",
        "    def forward(self, x):\n"
        "        return (torch.cumsum(x * 0.5, dim=-1), x.flip(-1).cumsum(-1).flip(-1),\n"
        "                torch.cumprod(x * 0.1 + 1.0, dim=1))\n",
        "[torch.randn(4, 37)]"), {"scan"}, ["own", "batch"]),
    "matmul": (problem("        self.lin = nn.Linear(32, 20)\n        self.b = nn.Parameter(torch.randn(20))\n",
        "    def forward(self, x, a, b):\n"
        "        return F.gelu(self.lin(x)) + self.b, torch.relu(torch.bmm(a, b)) * 0.5\n",
        "[torch.randn(6, 32), torch.randn(2, 16, 32), torch.randn(2, 32, 24)]"), {"matmul"},
        ["own", "x3", "batch"]),
    "attention": (problem("",
        "    def forward(self, q, k, v):\n"
        "        return F.scaled_dot_product_attention(q, k, v, is_causal=True)\n",
        "[torch.randn(1, 2, 16, 16), torch.randn(1, 2, 16, 16), torch.randn(1, 2, 16, 16)]"),
        {"attention"}, ["own", "neg"]),
}


#: launch configurations that keep the interpreter's programs few (it runs them one by one)
CONFIGS = {"batch_norm": {"g0": {"SPLITS": 1}},
           "batch_norm_1d": {"g0": {"SPLITS": 1, "BLOCK": 16}},
           "attention": {"g0": {"BLOCK_M": 16, "BLOCK_N": 16}},
           "norms": {g: {"BLOCK_O": 8} for g in ("g0", "g1", "g2", "g3")},
           "softmax_split": {g: {"ONE_PASS_MAX": 128, "BLOCK_R": 64, "SPLIT_CHUNK": 200} for g in ("g0", "g1")}}


CONV_BN_RELU = problem(
    "        self.conv = nn.Conv2d(2, 2, 3)\n        self.bn = nn.BatchNorm2d(2)\n",
    "    def forward(self, x):\n        return torch.relu(self.bn(self.conv(x)))\n",
    "[torch.randn(3, 2, 5, 4)]")
#: one program per channel for the statistics (the interpreter runs programs one by one)
ONE_SPLIT = {"g0": {"SPLITS": 1}}


LAYER_NORM = problem("        self.ln = nn.LayerNorm(257)\n",
                     "    def forward(self, x):\n        return self.ln(x)\n", "[torch.randn(7, 257)]")


LOG_SOFTMAX = problem("", "    def forward(self, x):\n        return torch.log_softmax(x, dim=-1)\n",
                      "[torch.randn(6, 40)]")
