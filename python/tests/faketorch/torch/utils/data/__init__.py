"""torch.utils.data as far as `coorfs run`'s hook and python/tests/run_job.py use it (see
torch/__init__.py here): datasets, the samplers, and a DataLoader whose iterators reach the
sampler as torch 2.x's do, single-process or with forked workers (pipes instead of queues)."""
import bisect
import os
import pickle

import torch

PREFETCH_FACTOR = 2  # torch's default: index batches given to each worker ahead


class Dataset:
    pass


class IterableDataset(Dataset):
    pass


class Subset(Dataset):
    def __init__(self, dataset, indices):
        self.dataset, self.indices = dataset, indices

    def __getitem__(self, i):
        return self.dataset[self.indices[i]]

    def __len__(self):
        return len(self.indices)


class ConcatDataset(Dataset):
    def __init__(self, datasets):
        self.datasets = list(datasets)
        self.cumulative_sizes, total = [], 0
        for d in self.datasets:
            total += len(d)
            self.cumulative_sizes.append(total)

    def __len__(self):
        return self.cumulative_sizes[-1]

    def __getitem__(self, i):
        part = bisect.bisect_right(self.cumulative_sizes, i)
        return self.datasets[part][i - (self.cumulative_sizes[part - 1] if part else 0)]


class Sampler:
    def __init__(self, data_source=None):
        pass


class SequentialSampler(Sampler):
    def __init__(self, data_source):
        self.data_source = data_source

    def __iter__(self):
        return iter(range(len(self.data_source)))

    def __len__(self):
        return len(self.data_source)


class RandomSampler(Sampler):
    def __init__(self, data_source, replacement=False, num_samples=None, generator=None):
        self.data_source, self.replacement = data_source, replacement
        self._num_samples, self.generator = num_samples, generator

    @property
    def num_samples(self):
        return len(self.data_source) if self._num_samples is None else self._num_samples

    def __iter__(self):
        n = len(self.data_source)
        if self.generator is None:
            generator = torch.Generator().manual_seed(torch.seed_from())
        else:
            generator = self.generator
        if self.replacement:
            for _ in range(self.num_samples // 32):
                yield from torch.randint(n, (32,), generator=generator).tolist()
            yield from torch.randint(n, (self.num_samples % 32,), generator=generator).tolist()
        else:
            for _ in range(self.num_samples // n):
                yield from torch.randperm(n, generator=generator).tolist()
            yield from torch.randperm(n, generator=generator).tolist()[: self.num_samples % n]

    def __len__(self):
        return self.num_samples


class SubsetRandomSampler(Sampler):
    def __init__(self, indices, generator=None):
        self.indices, self.generator = indices, generator

    def __iter__(self):
        for i in torch.randperm(len(self.indices), generator=self.generator).tolist():
            yield self.indices[i]

    def __len__(self):
        return len(self.indices)


class WeightedRandomSampler(Sampler):
    def __init__(self, weights, num_samples, replacement=True, generator=None):
        self.weights, self.num_samples = list(weights), num_samples
        self.replacement, self.generator = replacement, generator

    def __iter__(self):
        drawn = torch.multinomial(self.weights, self.num_samples, self.replacement, generator=self.generator)
        yield from iter(drawn.tolist())

    def __len__(self):
        return self.num_samples


class BatchSampler(Sampler):
    def __init__(self, sampler, batch_size, drop_last):
        self.sampler, self.batch_size, self.drop_last = sampler, batch_size, drop_last

    def __iter__(self):
        batch = []
        for i in self.sampler:
            batch.append(i)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch

    def __len__(self):
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)


class DistributedSampler(Sampler):
    """torch's, with drop_last=False and num_replicas and rank given."""

    def __init__(self, dataset, num_replicas, rank, shuffle=True, seed=0):
        self.dataset, self.num_replicas, self.rank = dataset, num_replicas, rank
        self.shuffle, self.seed, self.epoch = shuffle, seed, 0
        self.num_samples = -(-len(dataset) // num_replicas)
        self.total_size = self.num_samples * num_replicas

    def __iter__(self):
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed + self.epoch)
            indices = torch.randperm(len(self.dataset), generator=g).tolist()
        else:
            indices = list(range(len(self.dataset)))
        indices += indices[: self.total_size - len(indices)]
        return iter(indices[self.rank : self.total_size : self.num_replicas])

    def __len__(self):
        return self.num_samples

    def set_epoch(self, epoch):
        self.epoch = epoch


class _InfiniteConstantSampler(Sampler):
    def __iter__(self):
        while True:
            yield None


class DataLoader:
    def __init__(self, dataset, batch_size=1, shuffle=False, sampler=None, batch_sampler=None,
                 num_workers=0, collate_fn=None, drop_last=False, generator=None, persistent_workers=False):
        self.dataset, self.num_workers, self.generator = dataset, num_workers, generator
        self.collate_fn = collate_fn or list
        self.persistent_workers = persistent_workers
        self.batch_size = batch_size
        if isinstance(dataset, IterableDataset):
            sampler = _InfiniteConstantSampler()
        elif sampler is None:
            sampler = RandomSampler(dataset, generator=generator) if shuffle else SequentialSampler(dataset)
        if batch_sampler is None and batch_size is not None:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        self.sampler, self.batch_sampler = sampler, batch_sampler
        self._iterator = None

    @property
    def _index_sampler(self):
        return self.batch_sampler if self.batch_sampler is not None else self.sampler

    def __len__(self):
        return len(self._index_sampler)

    def __iter__(self):
        if self.num_workers == 0:
            return _SingleProcessDataLoaderIter(self)
        if not self.persistent_workers:
            return _MultiProcessingDataLoaderIter(self)
        if self._iterator is None:
            self._iterator = _MultiProcessingDataLoaderIter(self)
        else:
            self._iterator._reset(self)
        return self._iterator


def _fetch(dataset, collate_fn, index, auto_collation):
    return collate_fn([dataset[i] for i in index]) if auto_collation else dataset[index]


class _BaseDataLoaderIter:
    def __init__(self, loader):
        self._dataset = loader.dataset
        self._auto_collation = loader.batch_sampler is not None
        self._collate_fn = loader.collate_fn
        self._index_sampler = loader._index_sampler
        self._persistent = loader.persistent_workers
        self._batch_size = loader.batch_size
        self._sampler_iter = iter(self._index_sampler)
        self._base_seed = torch.seed_from(loader.generator)

    def __iter__(self):
        return self

    def _reset(self, loader, first_iter=False):
        self._sampler_iter = iter(self._index_sampler)

    def __next__(self):
        return self._next_data()


class _SingleProcessDataLoaderIter(_BaseDataLoaderIter):
    def __init__(self, loader):
        super().__init__(loader)
        self._stream = iter(self._dataset) if isinstance(self._dataset, IterableDataset) else None

    def _next_data(self):
        index = next(self._sampler_iter)
        if self._stream is None:
            return _fetch(self._dataset, self._collate_fn, index, self._auto_collation)
        batch = [x for _, x in zip(range(len(index)), self._stream)]
        if not batch:
            raise StopIteration
        return self._collate_fn(batch)


class _MultiProcessingDataLoaderIter(_BaseDataLoaderIter):
    def __init__(self, loader):
        super().__init__(loader)
        self._workers = []  # (pid, index pipe, result pipe)
        for worker_id in range(loader.num_workers):
            index_r, index_w = os.pipe()
            result_r, result_w = os.pipe()
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    for _, tasks, results in self._workers:
                        tasks.close()
                        results.close()
                    os.close(index_w)
                    os.close(result_r)
                    torch.manual_seed(self._base_seed + worker_id)
                    self._work(index_r, result_w)
                    code = 0
                finally:
                    os._exit(code)
            os.close(index_r)
            os.close(result_w)
            self._workers.append((pid, os.fdopen(index_w, "wb"), os.fdopen(result_r, "rb")))
        self._reset(loader, first_iter=True)

    def _work(self, index_fd, result_fd):
        with os.fdopen(index_fd, "rb") as tasks, os.fdopen(result_fd, "wb") as results:
            while True:
                try:
                    k, index = pickle.load(tasks)
                except EOFError:
                    return
                pickle.dump((k, _fetch(self._dataset, self._collate_fn, index, self._auto_collation)), results)
                results.flush()

    def _reset(self, loader, first_iter=False):
        super()._reset(loader, first_iter)
        self._sent = self._received = 0
        for _ in range(PREFETCH_FACTOR * len(self._workers)):
            self._put()

    def _put(self):
        try:
            index = next(self._sampler_iter)
        except StopIteration:
            return
        tasks = self._workers[self._sent % len(self._workers)][1]
        pickle.dump((self._sent, index), tasks)
        tasks.flush()
        self._sent += 1

    def _next_data(self):
        if self._received == self._sent:
            if not self._persistent:
                self._shutdown()
            raise StopIteration
        k, data = pickle.load(self._workers[self._received % len(self._workers)][2])
        assert k == self._received, (k, self._received)
        self._received += 1
        self._put()
        return data

    def _shutdown(self):
        workers, self._workers = self._workers, []
        for pid, tasks, results in workers:
            tasks.close()
            results.close()
            os.waitpid(pid, 0)

    def __del__(self):
        try:
            self._shutdown()
        except Exception:  # at interpreter exit
            pass
