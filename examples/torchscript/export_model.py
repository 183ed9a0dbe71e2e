"""Exports a Fashion-MNIST classifier as TorchScript for Chorus to train.

Chorus trains any module saved with torch.jit.script (or torch.jit.trace)
whose forward(input) returns what the loss takes: here [batch, 10] logits for
[batch, 1, 28, 28] images. Parameters are trained as they are in the file, so
initialize them here.

  /usr/bin/python3 examples/torchscript/export_model.py /tmp/fashion_mlp.pt
  chorus up --local 2 examples/torchscript/fashion_mnist_torchscript.textproto
"""
import sys

import torch


class FashionMlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.Sequential(
            torch.nn.Flatten(),
            torch.nn.Linear(28 * 28, 256),
            torch.nn.ReLU(),
            torch.nn.Dropout(0.1),
            torch.nn.Linear(256, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else '/tmp/fashion_mlp.pt'
    torch.manual_seed(0)
    torch.jit.script(FashionMlp()).save(path)
    print(f'wrote {path}')


if __name__ == '__main__':
    main()
