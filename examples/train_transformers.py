"""A Hugging Face Trainer under gpupilot: one callback brings live knobs and the job's figures.

    gpupilot run -- python3 examples/train_transformers.py
    gpupilot set RUN batch-size 16        # the per-device train batch, at one step on every rank
    gpupilot set RUN prefetch 4           # the DataLoader's prefetch_factor (with --workers > 0)

A tiny BERT made from a config (random weights, nothing downloaded) learns a random
classification task on the CPU, or on a GPU where there is one. Several ranks (torchrun, or
gpupilot's ``launcher = "ranks"``) train it data-parallel; the Trainer sets that up from RANK,
WORLD_SIZE and LOCAL_RANK. ``--no-gpupilot`` leaves the callback out: the script is then an
unmodified Trainer script, whose printed logs gpupilot reads through its ``transformers``
preset. ``--print-batches`` prints one JSON line per training batch: rank, step, batch size.
"""

import argparse
import json
import os
import sys
import time

import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainerCallback, TrainingArguments


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=float, default=2)
    p.add_argument("--samples", type=int, default=512, help="samples in the data set (all ranks)")
    p.add_argument("--batch-size", type=int, default=8, help="per device, until the operator changes it")
    p.add_argument("--accumulation", type=int, default=1, help="gradient accumulation steps")
    p.add_argument("--workers", type=int, default=0, help="DataLoader workers")
    p.add_argument("--prefetch", type=int, default=2, help="DataLoader prefetch_factor (with workers)")
    p.add_argument("--seq-len", type=int, default=16)
    p.add_argument("--lr-rule", choices=["linear", "sqrt"], help="scale the learning rate with the batch size")
    p.add_argument("--logging-steps", type=int, default=5)
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds to wait each step (a slower demo)")
    p.add_argument("--print-batches", action="store_true")
    p.add_argument("--no-gpupilot", action="store_true", help="train without the callback")
    p.add_argument("--output-dir", default=os.environ.get("GPUPILOT_RUN_DIR", "hf-output"))
    return p.parse_args()


class RandomTokens(torch.utils.data.Dataset):
    """Random token ids with a label that depends on them (so there is something to learn)."""

    def __init__(self, n, seq_len, vocab):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(1, vocab, (n, seq_len), generator=g)
        self.labels = (self.ids[:, 0] % 2).long()

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones_like(self.ids[i]), "labels": self.labels[i]}


class BatchPrinter(Trainer):
    """A Trainer that prints the size of each training batch it gets (``--print-batches``),
    and, with DataLoader workers, the running DataLoader iterator's prefetch factor and the
    batches it has asked its workers for and not yet handed over."""

    gp_callback = None

    def training_step(self, model, inputs):
        rank = int(os.environ.get("RANK", "0"))
        line = {"rank": rank, "step": self.state.global_step + 1, "bs": int(inputs["input_ids"].shape[0])}
        it = getattr(getattr(self.gp_callback, "plan", None), "iterator", None)
        if it is not None:
            line["prefetch"] = it._prefetch_factor
            line["queued"] = it._tasks_outstanding
        # One write per line: ranks may share one output file.
        sys.stdout.write(json.dumps(line) + "\n")
        sys.stdout.flush()
        return super().training_step(model, inputs)


class Sleep(TrainerCallback):
    """Slows each step down (a demo one can follow, or change, by hand)."""

    def __init__(self, seconds):
        self.seconds = seconds

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(self.seconds)


def main():
    args = parse_args()
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=128,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    model = BertForSequenceClassification(config)
    dataset = RandomTokens(args.samples, args.seq_len, config.vocab_size)
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    training = TrainingArguments(
        output_dir=args.output_dir,
        per_device_train_batch_size=args.batch_size,
        gradient_accumulation_steps=args.accumulation,
        num_train_epochs=args.epochs,
        learning_rate=5e-4,
        logging_steps=args.logging_steps,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        dataloader_num_workers=args.workers,
        use_cpu=not torch.cuda.is_available(),
        # Several ranks on CPUs talk gloo (NCCL is for GPUs); one process needs none.
        ddp_backend="gloo" if distributed and not torch.cuda.is_available() else None,
        seed=0,
        # Only with workers: torch 1.x wants its default (2) without, torch 2 none.
        **({"dataloader_prefetch_factor": args.prefetch} if args.workers else {})
    )
    callbacks = []
    gp_callback = None
    if not args.no_gpupilot:
        from gpupilot.integrations.transformers import GpupilotCallback

        gp_callback = GpupilotCallback(lr_rule=args.lr_rule)
        callbacks.append(gp_callback)
    if args.step_sleep:
        callbacks.append(Sleep(args.step_sleep))
    trainer_class = BatchPrinter if args.print_batches else Trainer
    BatchPrinter.gp_callback = gp_callback
    trainer = trainer_class(model=model, args=training, train_dataset=dataset, callbacks=callbacks)
    trainer.train()


if __name__ == "__main__":
    main()
