use super::*;

/// `c + a·e^(−b·x)` at x = 0, 1, ..., n − 1.
fn exponential(a: f64, b: f64, c: f64, n: usize) -> Vec<(f64, f64)> {
    (0..n)
        .map(|i| {
            let x = i as f64;
            (x, c + a * (-b * x).exp())
        })
        .collect()
}

#[test]
fn an_exponential_curve_seen_for_a_quarter_of_its_run_is_extrapolated_to_its_end() {
    let whole = exponential(2.0, 0.1, 0.3, 100);
    let seen = &whole[..25];
    let p = predict_with(Method::Exponential, seen, 99.0).unwrap();
    assert!((p.final_value - whole[99].1).abs() < 0.02, "{p:?}");
    // Within 5% of its reduction 2.0: below 0.3 + 0.1 = 0.4, from x = ln(20)/0.1 ≈ 30.
    let q = p.quality_at.unwrap();
    assert!((q - 30.0).abs() <= 2.0, "{p:?}");
    // The ensemble picks a family that fits as well.
    let best = predict(seen, 99.0).unwrap();
    assert!((best.final_value - whole[99].1).abs() < 0.05, "{best:?}");
}

#[test]
fn the_last_k_slope_never_rises_and_never_goes_below_zero() {
    let rising = [(0.0, 1.0), (1.0, 0.8), (2.0, 0.9), (3.0, 1.0)];
    let p = predict_with(Method::LastSlope, &rising, 100.0).unwrap();
    assert!(
        (p.final_value - 0.8).abs() < 1e-12,
        "flat at the best seen: {p:?}"
    );
    let steep = [(0.0, 1.0), (1.0, 0.5), (2.0, 0.1)];
    let p = predict_with(Method::LastSlope, &steep, 100.0).unwrap();
    assert_eq!(p.final_value, 0.0);
}

#[test]
fn too_few_points_or_a_rising_curve_give_no_parametric_fit() {
    assert!(predict_with(Method::Exponential, &[(0.0, 1.0), (1.0, 0.5)], 10.0).is_none());
    let rising: Vec<(f64, f64)> = (0..10).map(|i| (f64::from(i), f64::from(i))).collect();
    assert!(predict_with(Method::PowerLaw, &rising, 20.0).is_none());
    // The ensemble falls back to the slope.
    assert_eq!(predict(&rising, 20.0).unwrap().method, Method::LastSlope);
}

#[test]
fn the_family_that_fits_best_is_chosen() {
    let exp = exponential(2.0, 0.1, 0.3, 40);
    assert_eq!(predict(&exp, 99.0).unwrap().method, Method::Exponential);
    let power: Vec<(f64, f64)> = (0..40)
        .map(|i| {
            let x = f64::from(i);
            (x, 0.2 + 1.5 * (x + 1.0).powf(-0.7))
        })
        .collect();
    let p = predict(&power, 99.0).unwrap();
    assert_eq!(p.method, Method::PowerLaw);
    assert!(
        (p.final_value - (0.2 + 1.5 * 100f64.powf(-0.7))).abs() < 0.01,
        "{p:?}"
    );
}

#[test]
fn thinning_keeps_the_first_and_the_latest_value_and_the_bound() {
    let mut curve: Vec<u32> = Vec::new();
    for v in 0..10_000 {
        curve.push(v);
        thin(&mut curve, 100);
        assert!(curve.len() <= 100, "{} values", curve.len());
        assert_eq!(curve[0], 0);
        assert_eq!(*curve.last().unwrap(), v);
    }
    // Spread over the whole run, not bunched at its end.
    assert!(curve[curve.len() / 2] > 2_000, "{:?}", &curve[..10]);
}
