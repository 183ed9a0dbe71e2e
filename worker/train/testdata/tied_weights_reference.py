"""Reference run for the trainer's tied-weights test (run with /usr/bin/python3).

Usage: /usr/bin/python3 tied_weights_reference.py OUT_DIR STEPS GLOBAL_BATCH
       /usr/bin/python3 tied_weights_reference.py --load STATE_DICT.pt FINAL.pt

A small MLP whose parameters are shared: `again` is the `hidden` Linear
registered under a second name, and `out.weight` is `hidden.weight`.
PyTorch lists each shared parameter once. Writes to OUT_DIR:
  model.pt  TorchScript of the model's initial state
  data.pt   {'x': float32 [STEPS * GLOBAL_BATCH, 8], 'y': int64 [...]}
  final.pt  state_dict() after STEPS steps in one process (every name of a
            shared parameter), each step on the next GLOBAL_BATCH samples in
            order (what data-parallel ranks without shuffling train
            together): cross entropy, clip_grad_norm_ 0.5, SGD lr 0.05
            momentum 0.9
With --load: model.load_state_dict(torch.load(STATE_DICT.pt)) on a fresh
TiedMlp, strict, as a user loads `chorus export`'s file; exits 1 saying why
if that fails or the loaded parameters differ from FINAL.pt's.
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
    final = {name: t.detach().clone() for name, t in model.state_dict().items()}
    torch.save(final, os.path.join(out_dir, 'final.pt'))


def load(state_dict_path, final_path):
    model = TiedMlp()
    try:
        model.load_state_dict(torch.load(state_dict_path))
    except RuntimeError as e:
        print('load_state_dict failed: %s' % e)
        return 1
    final = torch.load(final_path)
    for name, p in model.named_parameters():
        if not torch.allclose(p, final[name], rtol=1e-5, atol=1e-6):
            print('%s differs after loading' % name)
            return 1
    if model.out.weight.data_ptr() != model.hidden.weight.data_ptr():
        print('out.weight is no longer hidden.weight')
        return 1
    print('loaded %d entries' % len(model.state_dict()))
    return 0


if __name__ == '__main__':
    if sys.argv[1] == '--load':
        sys.exit(load(sys.argv[2], sys.argv[3]))
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
