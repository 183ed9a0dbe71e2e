"""Reference run for the trainer's tied-weights test (run with /usr/bin/python3).

Usage: /usr/bin/python3 tied_weights_reference.py OUT_DIR STEPS GLOBAL_BATCH

A small MLP whose parameters are shared: `again` is the `hidden` Linear
registered under a second name, and `out.weight` is `hidden.weight`.
PyTorch lists each shared parameter once. Writes to OUT_DIR:
  model.pt  TorchScript of the model's initial state
  data.pt   {'x': float32 [STEPS * GLOBAL_BATCH, 8], 'y': int64 [...]}
  final.pt  {name: tensor} of named_parameters() after STEPS steps in one
            process, each on the next GLOBAL_BATCH samples in order (what
            data-parallel ranks without shuffling train together): cross
            entropy, clip_grad_norm_ 0.5, SGD lr 0.05 momentum 0.9
"""
import os
import sys

import torch


class TiedMlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = torch.nn.Linear(8, 8)
        self.again = self.hidden
        self.out = torch.nn.Linear(8, 8)
        self.out.weight = self.hidden.weight

    def forward(self, x):
        return self.out(torch.tanh(self.again(torch.tanh(self.hidden(x)))))


def main(out_dir, steps, global_batch):
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(3)
    model = TiedMlp()
    torch.jit.script(model).save(os.path.join(out_dir, 'model.pt'))
    x = torch.randn(steps * global_batch, 8)
    y = torch.randint(0, 8, (steps * global_batch,))
    torch.save({'x': x, 'y': y}, os.path.join(out_dir, 'data.pt'))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for s in range(steps):
        opt.zero_grad()
        batch = slice(s * global_batch, (s + 1) * global_batch)
        torch.nn.functional.cross_entropy(model(x[batch]), y[batch]).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
    final = {name: p.detach().clone() for name, p in model.named_parameters()}
    torch.save(final, os.path.join(out_dir, 'final.pt'))


if __name__ == '__main__':
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
