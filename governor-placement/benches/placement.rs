//! Placement decision cost of every policy on a 10,000-node cluster view (4 jobs per node,
//! mixed categories, 8 GPUs on one node in ten). `cargo bench -p coordinator --bench placement`.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use governor_placement::queue::{Queue, QueuedJob};
use governor_placement::{self as placement, ClusterView, JobRequest, JobView, NodeView};
use governor_policy::Category;

fn cluster(nodes: usize) -> ClusterView {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    ClusterView {
        nodes: (0..nodes)
            .map(|i| {
                let mut n = NodeView::new(format!("node{i:05}"), 32.0, 256 << 30);
                if i.is_multiple_of(10) {
                    n = n.with_gpus(8, "H100", 80 << 30);
                    for g in n.gpus.iter_mut().take((next() % 9) as usize) {
                        g.assigned = true;
                    }
                }
                n.cpu_used_cores = (next() % 32) as f64;
                for j in 0..4 {
                    let cat = Category::ALL[(next() % 4) as usize];
                    n.jobs_mut().push(JobView {
                        growth_efficiency: Some((next() % 1000) as f64 / 1000.0),
                        epoch: Some(next() % 50),
                        max_epochs: Some(50),
                        epoch_seconds: Some(30.0),
                        memory_bytes: 4 << 30,
                        ..JobView::running(format!("j{i}-{j}"), cat, (next() % 8) as f64)
                    });
                }
                n
            })
            .collect(),
    }
}

fn bench(c: &mut Criterion) {
    let view = cluster(10_000);
    let mut group = c.benchmark_group("place_10k_nodes");
    for (name, _) in placement::POLICIES {
        let mut policy = placement::by_name(name).unwrap();
        group.bench_function(*name, |b| {
            b.iter(|| {
                black_box(
                    policy
                        .place(black_box(&view), &JobRequest::new("new", 1))
                        .unwrap(),
                )
            })
        });
    }
    // `soonest` caches per-node sums by node revision, so the case above reads only the node
    // headers. The honest cases: every node changed (a cold cache), and 5% of the nodes changed
    // since the last placement (10,000 nodes reporting once a second, 20 placements a second).
    group.bench_function("soonest-cold", |b| {
        b.iter_batched(
            || placement::by_name("soonest").unwrap(),
            |mut policy| {
                black_box(
                    policy
                        .place(black_box(&view), &JobRequest::new("new", 1))
                        .unwrap(),
                )
            },
            criterion::BatchSize::SmallInput,
        )
    });
    let mut changing = view.clone();
    let mut policy = placement::by_name("soonest").unwrap();
    let mut next = 0;
    group.bench_function("soonest-5pct-changed", |b| {
        b.iter(|| {
            for _ in 0..500 {
                next = (next + 1) % changing.nodes.len();
                changing.nodes[next].jobs_mut();
            }
            black_box(
                policy
                    .place(black_box(&changing), &JobRequest::new("new", 1))
                    .unwrap(),
            )
        })
    });
    group.finish();
    // A queue of 100 waiting 16-GPU jobs (never fit) in front of one that fits: the round costs
    // one failed placement thanks to the "needs at least as much" skip, plus the one that fits.
    c.bench_function("admission_round_100_blocked_10k_nodes", |b| {
        let mut policy = placement::by_name("soonest").unwrap();
        b.iter_batched(
            || {
                let mut q = Queue::new();
                for k in 0..100 {
                    q.push(QueuedJob {
                        gpus: 16,
                        ..QueuedJob::new(format!("big{k}"), 0, k, 0.0)
                    });
                }
                q.push(QueuedJob::new("small", 0, 1000, 0.0));
                (q, view.clone())
            },
            // Return the inputs so that dropping the 10,000-node view is not timed.
            |(mut q, mut v)| {
                let round = q.admit(1.0, &mut v, policy.as_mut());
                (q, v, round)
            },
            criterion::BatchSize::LargeInput,
        )
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30);
    targets = bench
}
criterion_main!(benches);
