"""Writes the small files the trainer tests read (run with /usr/bin/python3).

  tiny_mlp_script.pt  a TorchScript MLP (8 -> 16 -> 3) from torch.jit.script
  tiny_data.pt        {'x': float32 [96, 8], 'y': int64 [96]} from torch.save
  tiny_eval.pt        the same format, 32 samples
  bad_keys.pt         {'inputs': ..., 'labels': ...}: wrong keys, for the error test

Labels come from a fixed linear teacher, so a model can learn them.

  /usr/bin/python3 worker/train/testdata/make_fixtures.py worker/train/testdata
"""
import os
import sys

import torch


class TinyMlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = torch.nn.Linear(8, 16)
        self.out = torch.nn.Linear(16, 3)

    def forward(self, x):
        return self.out(torch.relu(self.hidden(x)))


def main(out_dir):
    torch.manual_seed(7)
    teacher = torch.randn(8, 3)
    x = torch.randn(128, 8)
    y = (x @ teacher).argmax(1)
    torch.save({'x': x[:96].clone(), 'y': y[:96].clone()}, os.path.join(out_dir, 'tiny_data.pt'))
    torch.save({'x': x[96:].clone(), 'y': y[96:].clone()}, os.path.join(out_dir, 'tiny_eval.pt'))
    torch.save({'inputs': x[:4].clone(), 'labels': y[:4].clone()}, os.path.join(out_dir, 'bad_keys.pt'))
    torch.jit.script(TinyMlp()).save(os.path.join(out_dir, 'tiny_mlp_script.pt'))


if __name__ == '__main__':
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__)))
