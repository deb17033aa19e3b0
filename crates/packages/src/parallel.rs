//! Pure work spread over scoped threads. The full check of a store
//! ([`PackageManager::verify_all`](crate::PackageManager::verify_all)) checks each version
//! independently, so it runs on as many threads as it is given. ThreadSanitizer runs this
//! module's tests with the runtime's (`cargo xtask tsan`).

use std::sync::atomic::{AtomicUsize, Ordering};

/// `f` applied to every item on up to `jobs` threads, the results in the items' order. Threads
/// take the next unclaimed item one at a time, so uneven items keep every thread busy. A panic
/// in `f` is raised again on the calling thread once the others have stopped.
pub(crate) fn map<T: Sync, R: Send>(
    items: &[T],
    jobs: usize,
    f: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    let jobs = jobs.clamp(1, items.len().max(1));
    if jobs == 1 {
        return items.iter().map(f).collect();
    }
    let claimed = AtomicUsize::new(0);
    let mut out: Vec<Option<R>> = std::iter::repeat_with(|| None).take(items.len()).collect();
    let work = || {
        let mut mine = Vec::new();
        loop {
            let i = claimed.fetch_add(1, Ordering::Relaxed);
            let Some(item) = items.get(i) else {
                return mine;
            };
            mine.push((i, f(item)));
        }
    };
    std::thread::scope(|scope| {
        let threads: Vec<_> = (0..jobs).map(|_| scope.spawn(work)).collect();
        for thread in threads {
            match thread.join() {
                Ok(done) => {
                    for (i, r) in done {
                        out[i] = Some(r);
                    }
                }
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
    });
    // Every index was claimed exactly once, so every slot is filled.
    out.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parallel_map_keeps_the_order_and_uses_the_threads_it_is_given() {
        let items: Vec<u64> = (0..1000).collect();
        for jobs in [0, 1, 2, 7, 5000] {
            let threads = std::sync::Mutex::new(std::collections::HashSet::new());
            let out = map(&items, jobs, |x| {
                threads.lock().unwrap().insert(std::thread::current().id());
                x * 2
            });
            assert_eq!(
                out,
                items.iter().map(|x| x * 2).collect::<Vec<_>>(),
                "{jobs}"
            );
            assert!(threads.lock().unwrap().len() <= jobs.max(1), "{jobs}");
        }
        assert!(map(&[] as &[u8], 4, |x| *x).is_empty());
    }
}
