// Restore or recompute through the safe binding (docs/planner.md): a fast
// pool loads every block, a slow disk is computed, a comparable one splits;
// bad arguments are refused; the host reports its read-rate seeds.
use openinfer::*;

fn base(n: u64) -> RestorePlanArgs {
    RestorePlanArgs {
        prompt_tokens: n * 16 + 10,
        n_blocks: n,
        block_tokens: 16,
        block_bytes: 16 * 147_456,
        link_bytes_per_s: 25_000_000_000,
        prefill_ns_per_token: 15_000.0,
        prefill_ns_per_token_ctx: 2.0,
        ..Default::default()
    }
}

#[test]
fn plans_load_compute_and_split() {
    let p = plan_restore(&RestorePlanArgs { no_split: true, ..base(64) }).unwrap();
    assert_eq!((p.compute_head_blocks, p.load_blocks), (0, 64));
    assert_eq!(p.est_ns, p.est_load_all_ns);
    assert!(p.est_ns < p.est_cold_ns);

    let slow = plan_restore(&RestorePlanArgs {
        where_: vec![BlockWhere::Disk; 64],
        disk_bytes_per_s: 50_000_000,
        staged: true,
        ..base(64)
    })
    .unwrap();
    assert_eq!(slow.load_blocks, 0);
    assert_eq!(slow.est_ns, slow.est_cold_ns);

    let both = plan_restore(&RestorePlanArgs {
        where_: vec![BlockWhere::Disk; 1024],
        disk_bytes_per_s: 1_650_000_000,
        prefill_ns_per_token: 20_000.0,
        prefill_ns_per_token_ctx: 1.5,
        ..base(1024)
    })
    .unwrap();
    assert!(both.compute_head_blocks > 0 && both.load_blocks > 0);
    assert!(both.est_ns < both.est_cold_ns && both.est_ns < both.est_load_all_ns);
}

#[test]
fn bad_plans_are_refused() {
    let e = plan_restore(&RestorePlanArgs { where_: vec![BlockWhere::Disk; 8], ..base(8) })
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
    assert!(e.to_string().contains("disk_bytes_per_s"), "{}", e);
    let e = plan_restore(&RestorePlanArgs { block_tokens: 0, ..base(8) }).unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
}

#[test]
fn host_reports_rate_seeds() {
    let mut o = HostOptions::new(4 << 20);
    o.pin = Some(false);
    let host = OffloadHost::new(&o).unwrap();
    let s = host.stats().unwrap();
    assert_eq!(s.link_bytes_per_s, sys::OI_RATE_DEFAULT_LINK);
    assert_eq!(s.disk_bytes_per_s, sys::OI_RATE_DEFAULT_DISK as u64);
    assert_eq!(s.remote_bytes_per_s, sys::OI_RATE_DEFAULT_REMOTE as u64);
}
