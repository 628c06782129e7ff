//! CHAP tests: known answers, whole exchanges target ⇄ initiator, and every refusal.
//! The expected digests were computed independently with Python's hashlib, e.g.
//! `hashlib.md5(bytes([0x2a]) + b"riser-chap-secret" + bytes(range(32))).hexdigest()`.

use super::*;
use crate::text::encode_hex;

const USER: &str = "iqn.1994-05.com.redhat:client";
const SECRET: &str = "riser-chap-secret";
const MUSER: &str = "iqn.2016-06.io.riser:target";
const MSECRET: &str = "target-secret-99";

fn kv(pairs: &[(&str, &str)]) -> Pairs {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn get<'a>(pairs: &'a Pairs, k: &str) -> &'a str {
    pairs
        .iter()
        .find(|(a, _)| a == k)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no {k} in {pairs:?}"))
}

/// A deterministic source: 1, 2, 3, ... from `start`.
fn counter(start: u8) -> Box<dyn RandomSource> {
    let mut n = start;
    Box::new(move |buf: &mut [u8]| {
        for b in buf {
            *b = n;
            n = n.wrapping_add(1);
        }
    })
}

fn secret(mutual: bool) -> ChapSecret {
    ChapSecret {
        user: USER.into(),
        secret: SECRET.into(),
        muser: mutual.then(|| MUSER.into()),
        msecret: mutual.then(|| MSECRET.into()),
    }
}

fn target(mutual_required: bool) -> ChapTarget {
    let others = ChapSecret {
        user: "someone-else".into(),
        secret: "another-secret".into(),
        muser: None,
        msecret: None,
    };
    ChapTarget::with_random(vec![others, secret(true)], mutual_required, counter(1))
}

fn initiator(algorithms: &[ChapAlgorithm], mutual: bool) -> ChapInitiator {
    let config = ChapInitiatorConfig {
        credentials: ChapCredentials::new(USER, SECRET),
        mutual: mutual.then(|| ChapCredentials::new(MUSER, MSECRET)),
        algorithms: algorithms.to_vec(),
    };
    ChapInitiator::with_random(config, counter(200))
}

/// Steps the target; Err(reason) on failure.
fn step(t: &mut ChapTarget, keys: &Pairs) -> Result<(AuthStep, Pairs), String> {
    let mut out = Pairs::new();
    match t.step(keys, &mut out) {
        AuthStep::Failure => {
            assert!(out.is_empty(), "nothing is sent on failure: {out:?}");
            Err(t.failure_reason().expect("a reason"))
        }
        s => Ok((s, out)),
    }
}

/// The target's challenge step after the initiator's CHAP_A.
fn challenge(t: &mut ChapTarget, chap_a: &str) -> Pairs {
    let (s, out) = step(t, &kv(&[("CHAP_A", chap_a)])).unwrap();
    assert_eq!(s, AuthStep::Continue);
    out
}

/// The whole exchange, as the login drives it.
fn exchange(t: &mut ChapTarget, i: &mut ChapInitiator) -> Result<(), String> {
    let (s, out) = step(t, &Pairs::new())?;
    assert_eq!((s, out.len()), (AuthStep::Continue, 0), "the step that chose CHAP");
    let offer = i.offer().map_err(|e| e.to_string())?;
    let (s, out) = step(t, &offer)?;
    assert_eq!(s, AuthStep::Continue);
    let answer = i.respond(&out).map_err(|e| e.to_string())?;
    let (s, out) = step(t, &answer)?;
    assert_eq!(s, AuthStep::Success);
    i.verify(&out).map_err(|e| e.to_string())
}

#[test]
fn known_answer_vectors() {
    let ch: Vec<u8> = (0u8..32).collect();
    let v = |alg: ChapAlgorithm, id, secret: &str, ch: &[u8]| encode_hex(&alg.response(id, secret.as_bytes(), ch));
    use ChapAlgorithm::*;
    assert_eq!(v(Md5, 0x2a, SECRET, &ch), "0x09381ed518910ae5777be907d13d6f81");
    assert_eq!(v(Sha1, 0x2a, SECRET, &ch), "0x03e584649d2b119abc8748d9c644334673d169a9");
    assert_eq!(
        v(Sha256, 0x2a, SECRET, &ch),
        "0xcb7a7df0b522c354cbda6615df998b3de5b544173210b49adb3de93d7011fefb"
    );
    assert_eq!(
        v(Sha3_256, 0x2a, SECRET, &ch),
        "0xa174ebadc18bf808271107ff30a829e376a4ebce12c1975485d217c9a7118142"
    );
    let ff = [0xffu8; 16];
    assert_eq!(v(Md5, 255, "s", &ff), "0x92f82b2e134126c1f2c0ef33be96d01d");
    assert_eq!(v(Sha1, 255, "s", &ff), "0x2d815059d3e93873659a4e5c2c44ccf49abdff3d");
    assert_eq!(
        v(Sha256, 255, "s", &ff),
        "0x8fdc0ea7817ecd8cab7e139a404edfa2e50c183872ac3e9ffaf1602f18fa0175"
    );
    assert_eq!(
        v(Sha3_256, 255, "s", &ff),
        "0x201b3573f6b23672dce8d474415cb11880fef2c6a853cc9502f8e548b8804bc0"
    );
    for alg in ChapAlgorithm::ALL {
        assert_eq!(alg.response(1, b"x", b"y").len(), alg.digest_len());
        assert!(alg.challenge_len() >= MIN_CHALLENGE_LEN);
    }
}

#[test]
fn algorithm_names_and_numbers() {
    use ChapAlgorithm::*;
    assert_eq!(ChapAlgorithm::ALL.map(|a| a.id()), [7, 8, 6, 5]);
    for alg in ChapAlgorithm::ALL {
        assert_eq!(ChapAlgorithm::from_id(alg.id().into()), Some(alg));
        assert_eq!(alg.name().parse::<ChapAlgorithm>(), Ok(alg));
        assert_eq!(alg.to_string(), alg.name());
    }
    assert_eq!("SHA-256".parse(), Ok(Sha256));
    assert_eq!("sha3_256".parse(), Ok(Sha3_256));
    assert_eq!("5".parse(), Ok(Md5));
    assert!("sha512"
        .parse::<ChapAlgorithm>()
        .unwrap_err()
        .contains("md5, sha1, sha256 or sha3-256"));
    assert_eq!(ChapAlgorithm::from_id(4), None);
    assert_eq!(ChapAlgorithm::from_id(9), None);
    assert_eq!(Sha256.challenge_len(), 32);
    assert_eq!(Md5.challenge_len(), 16);
}

#[test]
fn binary_values() {
    let d = |s: &str| decode_binary("CHAP_C", s, MAX_BINARY_LEN);
    assert_eq!(d("0x00ff10"), Ok((vec![0, 0xff, 0x10], Encoding::Hex)));
    assert_eq!(d("0XABcd"), Ok((vec![0xab, 0xcd], Encoding::Hex)));
    let b64 = (
        vec![
            0xa0, 0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7, 0xa8, 0xa9, 0xaa, 0xab, 0xac, 0xad, 0xae, 0xaf,
        ],
        Encoding::Base64,
    );
    // Python: base64.b64encode(bytes(range(0xa0, 0xb0)))
    assert_eq!(d("0boKGio6SlpqeoqaqrrK2urw=="), Ok(b64.clone()));
    assert_eq!(d("0BoKGio6SlpqeoqaqrrK2urw"), Ok(b64.clone()), "padding optional");
    assert_eq!(encode_binary(&b64.0, Encoding::Base64), "0boKGio6SlpqeoqaqrrK2urw==");
    assert_eq!(encode_binary(&[1, 0xab], Encoding::Hex), "0x01ab");

    let why = |s: &str| match d(s) {
        Err(ChapError::BadValue { key: "CHAP_C", why }) => why,
        other => panic!("{s}: {other:?}"),
    };
    assert_eq!(why("0xabc"), "odd number of hex digits");
    assert_eq!(why("0x0"), "odd number of hex digits");
    assert_eq!(why("0xzz"), "not hex");
    assert_eq!(why("0x"), "empty");
    assert_eq!(why("0b"), "empty");
    assert_eq!(why("0b!!!!"), "bad base64");
    assert_eq!(why("0b=AAA"), "bad base64");
    assert_eq!(why("0bA"), "bad base64");
    assert_eq!(why("1234"), "not a 0x or 0b binary value");
    assert_eq!(why("0"), "not a 0x or 0b binary value");
    assert_eq!(why(""), "not a 0x or 0b binary value");
    assert_eq!(why("é"), "not a 0x or 0b binary value");
    assert_eq!(why("0xé0"), "odd number of hex digits");
    assert_eq!(why("0xéé"), "not hex");
    // 1024 bytes is the most (RFC 7143 §12.1.3), in either encoding.
    assert_eq!(d(&encode_hex(&[7; 1024])).map(|v| v.0.len()), Ok(1024));
    assert_eq!(
        d(&encode_binary(&[7; 1024], Encoding::Base64)).map(|v| v.0.len()),
        Ok(1024)
    );
    assert_eq!(why(&encode_hex(&[7; 1025])), "too long");
    assert_eq!(why(&encode_binary(&[7; 1025], Encoding::Base64)), "too long");
    // 1 MiB of text is refused on its length, before decoding.
    let huge = format!("0x{}", "a".repeat(1 << 20));
    let t = std::time::Instant::now();
    assert_eq!(why(&huge), "too long");
    assert!(t.elapsed() < std::time::Duration::from_millis(50));
    // A tighter cap (a response of one digest size).
    assert!(decode_binary("CHAP_R", &encode_hex(&[0; 17]), 16).is_err());
}

#[test]
fn exchange_every_algorithm_one_way_and_mutual() {
    for alg in ChapAlgorithm::ALL {
        for mutual in [false, true] {
            let mut t = target(mutual);
            let mut i = initiator(&[alg], mutual);
            exchange(&mut t, &mut i).unwrap_or_else(|e| panic!("{alg} mutual={mutual}: {e}"));
            assert_eq!(t.authenticated_user(), Some(USER));
            assert!(i.is_done() && i.answered());
            assert_eq!(i.algorithm(), Some(alg));
        }
    }
    // With the OS random source and the default offer.
    let mut t = ChapTarget::new(vec![secret(true)], true);
    let mut i = ChapInitiator::new(ChapInitiatorConfig {
        mutual: Some(ChapCredentials::new(MUSER, MSECRET)),
        ..ChapInitiatorConfig::new(ChapCredentials::new(USER, SECRET))
    });
    exchange(&mut t, &mut i).unwrap();
    assert_eq!(i.algorithm(), Some(ChapAlgorithm::Sha256));
}

/// The keys on the wire, known in advance with a fixed random source.
#[test]
fn wire_format_known_answer() {
    let mut t = ChapTarget::with_random(vec![secret(false)], false, Box::new(|b: &mut [u8]| b.fill(0x11)));
    let out = challenge(&mut t, "5");
    assert_eq!(
        out,
        kv(&[("CHAP_A", "5"), ("CHAP_I", "17"), ("CHAP_C", &encode_hex(&[0x11; 16]))])
    );
    // Python: hashlib.md5(bytes([17]) + b"riser-chap-secret" + b"\x11" * 16).hexdigest()
    let (s, out) = step(
        &mut t,
        &kv(&[("CHAP_N", USER), ("CHAP_R", "0x31364cb0e837ea4850cf868dcbc37763")]),
    )
    .unwrap();
    assert_eq!((s, out), (AuthStep::Success, Pairs::new()));
    // Upper-case hex digits are the same value.
    let mut t = ChapTarget::with_random(vec![secret(false)], false, Box::new(|b: &mut [u8]| b.fill(0x11)));
    challenge(&mut t, "5");
    let (s, _) = step(
        &mut t,
        &kv(&[("CHAP_N", USER), ("CHAP_R", "0X31364CB0E837EA4850CF868DCBC37763")]),
    )
    .unwrap();
    assert_eq!(s, AuthStep::Success);
}

#[test]
fn target_follows_the_initiators_preference() {
    use ChapAlgorithm::*;
    let pick = |allowed: &[ChapAlgorithm], offer: &str| {
        let mut t = target(false).with_algorithms(allowed.to_vec());
        let r = step(&mut t, &kv(&[("CHAP_A", offer)]));
        r.map(|(_, out)| get(&out, "CHAP_A").to_string())
    };
    assert_eq!(pick(&ChapAlgorithm::ALL, "5,7").unwrap(), "5");
    assert_eq!(pick(&ChapAlgorithm::ALL, "7,8,6,5").unwrap(), "7");
    assert_eq!(pick(&[Md5, Sha256], "8,6,5,7").unwrap(), "5");
    assert_eq!(pick(&ChapAlgorithm::ALL, "99,x,,0x06").unwrap(), "6");
    // Nothing in common.
    let e = pick(&ChapAlgorithm::ALL, "1,2,128").unwrap_err();
    assert!(e.contains("no CHAP algorithm in common"), "{e}");
    assert!(pick(&[Sha256], "5").unwrap_err().contains("no CHAP algorithm"));
    assert!(pick(&ChapAlgorithm::ALL, "").is_err());
    assert!(pick(&ChapAlgorithm::ALL, &"5,".repeat(200)).is_err(), "over-long list");
    // The initiator refuses an algorithm it did not offer.
    let mut i = initiator(&[Sha256], false);
    i.offer().unwrap();
    let e = i
        .respond(&kv(&[("CHAP_A", "5"), ("CHAP_I", "1"), ("CHAP_C", "0x0102")]))
        .unwrap_err();
    assert!(matches!(e, ChapError::NoCommonAlgorithm(_)), "{e}");
    assert!(initiator(&[], false).offer().is_err());
}

/// The initiator's answer to `t`'s challenge, with its keys changed by `edit`.
fn tampered(
    t: &mut ChapTarget,
    mutual: bool,
    edit: impl FnOnce(&mut Pairs, &Pairs),
) -> Result<(AuthStep, Pairs), String> {
    let mut i = initiator(&[ChapAlgorithm::Sha256], mutual);
    let offer = i.offer().unwrap();
    let (_, ch) = step(t, &offer).unwrap();
    let mut answer = i.respond(&ch).unwrap();
    edit(&mut answer, &ch);
    step(t, &answer)
}

fn set(p: &mut Pairs, k: &str, v: &str) {
    match p.iter_mut().find(|(a, _)| a == k) {
        Some(kv) => kv.1 = v.to_string(),
        None => p.push((k.to_string(), v.to_string())),
    }
}

fn remove(p: &mut Pairs, k: &str) {
    p.retain(|(a, _)| a != k);
}

#[test]
fn reflected_challenge_refused() {
    let mut t = target(false);
    let e = tampered(&mut t, true, |a, ch| set(a, "CHAP_C", get(ch, "CHAP_C"))).unwrap_err();
    assert!(e.contains("reflected"), "{e}");
    assert_eq!(t.failure(), Some(&ChapError::ReflectedChallenge));
    // The same bytes in base64 are the same challenge.
    let mut t = target(false);
    let e = tampered(&mut t, true, |a, ch| {
        let bytes = decode_binary("CHAP_C", get(ch, "CHAP_C"), MAX_BINARY_LEN).unwrap().0;
        set(a, "CHAP_C", &encode_binary(&bytes, Encoding::Base64))
    })
    .unwrap_err();
    assert!(e.contains("reflected"), "{e}");
}

#[test]
fn wrong_identifier() {
    // A response computed with another identifier.
    let mut t = target(false);
    let e = tampered(&mut t, false, |a, ch| {
        let id: u8 = get(ch, "CHAP_I").parse().unwrap();
        let c = decode_binary("CHAP_C", get(ch, "CHAP_C"), MAX_BINARY_LEN).unwrap().0;
        let r = ChapAlgorithm::Sha256.response(id.wrapping_add(1), SECRET.as_bytes(), &c);
        set(a, "CHAP_R", &encode_hex(&r));
    })
    .unwrap_err();
    assert!(e.contains("wrong CHAP response"), "{e}");
    // The initiator's CHAP_I (mutual) must be a number from 0 to 255.
    for bad in ["256", "-1", "abc", "", "1.5", "0x100", &"1".repeat(300)] {
        let mut t = target(false);
        let e = tampered(&mut t, true, |a, _| set(a, "CHAP_I", bad)).unwrap_err();
        assert!(e.contains("CHAP_I"), "{bad}: {e}");
    }
    for good in ["0", "255", "0xff"] {
        let mut t = target(false);
        tampered(&mut t, true, |a, _| set(a, "CHAP_I", good)).unwrap();
    }
    // And the target's, for the initiator.
    let mut i = initiator(&[ChapAlgorithm::Md5], false);
    i.offer().unwrap();
    assert_eq!(
        i.respond(&kv(&[("CHAP_A", "5"), ("CHAP_I", "300"), ("CHAP_C", "0x0102")])),
        Err(ChapError::BadIdentifier)
    );
}

/// A change to an initiator's answer.
type Edit = Box<dyn Fn(&mut Pairs)>;

#[test]
fn malformed_values_fail() {
    let cases: Vec<(&str, Edit)> = vec![
        ("odd-length hex CHAP_R", Box::new(|a| set(a, "CHAP_R", "0x123"))),
        ("short CHAP_R", Box::new(|a| set(a, "CHAP_R", "0x1234"))),
        ("long CHAP_R", Box::new(|a| set(a, "CHAP_R", &encode_hex(&[1; 33])))),
        (
            "1 MiB CHAP_R",
            Box::new(|a| set(a, "CHAP_R", &format!("0x{}", "0".repeat(1 << 20)))),
        ),
        ("decimal CHAP_R", Box::new(|a| set(a, "CHAP_R", "12345"))),
        ("bad base64 CHAP_R", Box::new(|a| set(a, "CHAP_R", "0b%%%%"))),
        ("odd-length hex CHAP_C", Box::new(|a| set(a, "CHAP_C", "0x12345"))),
        (
            "1 MiB CHAP_C",
            Box::new(|a| set(a, "CHAP_C", &format!("0x{}", "ab".repeat(1 << 19)))),
        ),
        (
            "1025-byte CHAP_C",
            Box::new(|a| set(a, "CHAP_C", &encode_hex(&[1; 1025]))),
        ),
        ("bad base64 CHAP_C", Box::new(|a| set(a, "CHAP_C", "0bA"))),
        ("empty CHAP_N", Box::new(|a| set(a, "CHAP_N", ""))),
        ("long CHAP_N", Box::new(|a| set(a, "CHAP_N", &"n".repeat(256)))),
        ("no CHAP_N", Box::new(|a| remove(a, "CHAP_N"))),
        ("no CHAP_R", Box::new(|a| remove(a, "CHAP_R"))),
        ("CHAP_I without CHAP_C", Box::new(|a| remove(a, "CHAP_C"))),
        ("CHAP_C without CHAP_I", Box::new(|a| remove(a, "CHAP_I"))),
        ("CHAP_R twice", Box::new(|a| a.push(("CHAP_R".into(), "0x00".into())))),
        ("CHAP_A again", Box::new(|a| a.push(("CHAP_A".into(), "5".into())))),
        ("unknown CHAP key", Box::new(|a| a.push(("CHAP_X".into(), "1".into())))),
    ];
    for (what, edit) in cases {
        let mut t = target(false);
        let r = tampered(&mut t, true, |a, _| edit(a));
        assert!(r.is_err(), "{what}: {r:?}");
        // Failed for good: nothing more is accepted.
        assert!(step(&mut t, &Pairs::new()).is_err(), "{what}");
    }
}

#[test]
fn unknown_user_and_wrong_secret() {
    let mut t = target(false);
    let e = tampered(&mut t, false, |a, _| set(a, "CHAP_N", "mallory")).unwrap_err();
    assert_eq!(e, "unknown CHAP user \"mallory\"");
    // The other user's name with our secret's response.
    let mut t = target(false);
    let e = tampered(&mut t, false, |a, _| set(a, "CHAP_N", "someone-else")).unwrap_err();
    assert_eq!(e, "wrong CHAP response for user \"someone-else\"");
    // A wrong secret.
    let mut t = target(false);
    let mut i = ChapInitiator::with_random(
        ChapInitiatorConfig::new(ChapCredentials::new(USER, "not-the-secret")),
        counter(5),
    );
    let e = exchange(&mut t, &mut i).unwrap_err();
    assert!(e.contains("wrong CHAP response"), "{e}");
    assert!(!e.contains("not-the-secret") && !e.contains(SECRET));
    // No secrets at all.
    let mut t = ChapTarget::with_random(Vec::new(), false, counter(1));
    assert!(exchange(&mut t, &mut initiator(&ChapAlgorithm::ALL, false)).is_err());
    // A hostile name is quoted escaped and cut short.
    let mut t = target(false);
    let e = tampered(&mut t, false, |a, _| {
        set(a, "CHAP_N", &format!("x\n{}", "y".repeat(200)))
    })
    .unwrap_err();
    assert!(e.contains("x\\ny") && e.ends_with("...\"") && e.len() < 120, "{e}");
}

#[test]
fn mutual_rules() {
    // Required and not asked for.
    let mut t = target(true);
    let e = exchange(&mut t, &mut initiator(&ChapAlgorithm::ALL, false)).unwrap_err();
    assert!(e.contains("mutual CHAP required"), "{e}");
    // Asked for, but the user has no mutual secret.
    let mut t = ChapTarget::with_random(vec![secret(false)], false, counter(1));
    let e = exchange(&mut t, &mut initiator(&ChapAlgorithm::ALL, true)).unwrap_err();
    assert!(e.contains("no mutual secret"), "{e}");
    // Not required and not asked for: one-way even when a mutual secret exists.
    let mut t = target(false);
    exchange(&mut t, &mut initiator(&ChapAlgorithm::ALL, false)).unwrap();
}

#[test]
fn initiator_refuses_a_wrong_target() {
    // The target knows another mutual secret.
    let mut wrong = secret(true);
    wrong.msecret = Some("not-the-target-secret".into());
    let mut t = ChapTarget::with_random(vec![wrong], false, counter(1));
    let mut i = initiator(&ChapAlgorithm::ALL, true);
    let e = exchange(&mut t, &mut i).unwrap_err();
    assert_eq!(e, ChapError::WrongTargetResponse.to_string());
    assert!(!i.is_done());
    assert_eq!(i.verify(&Pairs::new()), Err(ChapError::Failed), "failed for good");
    // Another name.
    let mut renamed = secret(true);
    renamed.muser = Some("iqn.2016-06.io.riser:impostor".into());
    let mut t = ChapTarget::with_random(vec![renamed], false, counter(1));
    let e = exchange(&mut t, &mut initiator(&ChapAlgorithm::ALL, true)).unwrap_err();
    assert!(e.contains("impostor"), "{e}");
    // No answer at all, or a malformed one.
    for keys in [
        Pairs::new(),
        kv(&[("CHAP_N", MUSER)]),
        kv(&[("CHAP_N", MUSER), ("CHAP_R", "0x123")]),
        kv(&[("CHAP_N", MUSER), ("CHAP_R", "0x00"), ("CHAP_C", "0x00")]),
    ] {
        let mut i = initiator(&[ChapAlgorithm::Md5], true);
        i.offer().unwrap();
        i.respond(&kv(&[
            ("CHAP_A", "5"),
            ("CHAP_I", "1"),
            ("CHAP_C", &encode_hex(&[9; 16])),
        ]))
        .unwrap();
        assert!(i.verify(&keys).is_err(), "{keys:?}");
    }
    // One-way: keys from the target after our response are unexpected.
    let mut i = initiator(&[ChapAlgorithm::Md5], false);
    i.offer().unwrap();
    i.respond(&kv(&[
        ("CHAP_A", "5"),
        ("CHAP_I", "1"),
        ("CHAP_C", &encode_hex(&[9; 16])),
    ]))
    .unwrap();
    assert!(i.verify(&kv(&[("CHAP_N", MUSER)])).is_err());
    // Out of order.
    let mut i = initiator(&[ChapAlgorithm::Md5], false);
    assert!(i.respond(&kv(&[("CHAP_A", "5")])).is_err());
    let mut i = initiator(&[ChapAlgorithm::Md5], false);
    assert_eq!(i.verify(&Pairs::new()), Err(ChapError::Failed));
}

#[test]
fn same_secret_both_ways_refused() {
    let mut same = secret(true);
    same.msecret = Some(SECRET.into());
    let mut t = ChapTarget::with_random(vec![same], false, counter(1));
    let e = exchange(&mut t, &mut initiator(&ChapAlgorithm::ALL, false)).unwrap_err();
    assert!(e.contains("other direction's secret"), "{e}");
    // The initiator side: a target whose mutual secret is ours.
    let mut i = ChapInitiator::with_random(
        ChapInitiatorConfig {
            mutual: Some(ChapCredentials::new(MUSER, SECRET)),
            ..ChapInitiatorConfig::new(ChapCredentials::new(USER, SECRET))
        },
        counter(50),
    );
    i.offer().unwrap();
    let ch = kv(&[("CHAP_A", "7"), ("CHAP_I", "3"), ("CHAP_C", &encode_hex(&[4; 32]))]);
    let answer = i.respond(&ch).unwrap();
    let their_id: u8 = get(&answer, "CHAP_I").parse().unwrap();
    let their_c = decode_binary("CHAP_C", get(&answer, "CHAP_C"), MAX_BINARY_LEN)
        .unwrap()
        .0;
    let r = ChapAlgorithm::Sha256.response(their_id, SECRET.as_bytes(), &their_c);
    assert_eq!(
        i.verify(&kv(&[("CHAP_N", MUSER), ("CHAP_R", &encode_hex(&r))])),
        Err(ChapError::SecretReuse)
    );
}

#[test]
fn base64_forms() {
    // The target's challenge in hex; the initiator answers in base64, challenges in base64,
    // and gets the mutual answer in base64.
    let mut t = target(false);
    let ch = challenge(&mut t, "7");
    let id: u8 = get(&ch, "CHAP_I").parse().unwrap();
    let (c, enc) = decode_binary("CHAP_C", get(&ch, "CHAP_C"), MAX_BINARY_LEN).unwrap();
    assert_eq!((enc, c.len()), (Encoding::Hex, 32));
    let r = ChapAlgorithm::Sha256.response(id, SECRET.as_bytes(), &c);
    let their_c: Vec<u8> = (0xa0..0xb0).collect();
    let (s, out) = step(
        &mut t,
        &kv(&[
            ("CHAP_N", USER),
            ("CHAP_R", &encode_binary(&r, Encoding::Base64)),
            ("CHAP_I", "9"),
            ("CHAP_C", "0boKGio6SlpqeoqaqrrK2urw=="),
        ]),
    )
    .unwrap();
    assert_eq!(s, AuthStep::Success);
    // Python: base64.b64encode(hashlib.sha256(bytes([9]) + b"target-secret-99" + bytes(range(0xa0, 0xb0))).digest())
    assert_eq!(
        out,
        kv(&[
            ("CHAP_N", MUSER),
            ("CHAP_R", "0bsFFNsv/Fl4BucA1znL/mhLerbxiRpnCowaTbchs+AMQ=")
        ])
    );
    assert_eq!(
        decode_binary("CHAP_R", get(&out, "CHAP_R"), 32).unwrap().0,
        ChapAlgorithm::Sha256.response(9, MSECRET.as_bytes(), &their_c)
    );
    // The initiator answers a base64 challenge in base64.
    let mut i = initiator(&[ChapAlgorithm::Md5], false);
    i.offer().unwrap();
    let answer = i
        .respond(&kv(&[
            ("CHAP_A", "5"),
            ("CHAP_I", "1"),
            ("CHAP_C", "0boKGio6SlpqeoqaqrrK2urw=="),
        ]))
        .unwrap();
    let r = get(&answer, "CHAP_R");
    assert!(r.starts_with("0b"), "{r}");
    assert_eq!(
        decode_binary("CHAP_R", r, 16).unwrap().0,
        ChapAlgorithm::Md5.response(1, SECRET.as_bytes(), &their_c)
    );
}

#[test]
fn protocol_order() {
    // CHAP_N before CHAP_A.
    let mut t = target(false);
    assert!(step(&mut t, &kv(&[("CHAP_N", USER), ("CHAP_R", "0x00")])).is_err());
    // CHAP_A with other keys.
    let mut t = target(false);
    assert!(step(&mut t, &kv(&[("CHAP_A", "5"), ("CHAP_C", "0x00")])).is_err());
    // CHAP_A twice in one step.
    let mut t = target(false);
    assert!(step(&mut t, &kv(&[("CHAP_A", "5"), ("CHAP_A", "7")])).is_err());
    // Empty steps wait; keys after success are refused.
    let mut t = target(false);
    assert_eq!(step(&mut t, &Pairs::new()).unwrap().0, AuthStep::Continue);
    challenge(&mut t, "7");
    assert_eq!(step(&mut t, &Pairs::new()).unwrap().0, AuthStep::Continue);
    assert_eq!(t.algorithm(), Some(ChapAlgorithm::Sha256));
    let mut t = target(false);
    exchange(&mut t, &mut initiator(&ChapAlgorithm::ALL, false)).unwrap();
    assert_eq!(step(&mut t, &Pairs::new()).unwrap().0, AuthStep::Success);
    assert!(step(&mut t, &kv(&[("CHAP_A", "5")])).is_err());
    assert_eq!(t.authenticated_user(), None, "failed after all");
    // The initiator offers once.
    let mut i = initiator(&ChapAlgorithm::ALL, false);
    assert_eq!(i.offer().unwrap(), kv(&[("CHAP_A", "7,8,6,5")]));
    assert!(i.offer().is_err());
}

#[test]
fn random_source_failure_fails_the_login() {
    struct Broken;
    impl RandomSource for Broken {
        fn fill(&mut self, _: &mut [u8]) -> Result<(), ChapError> {
            Err(ChapError::Random("no entropy".into()))
        }
    }
    let mut t = ChapTarget::with_random(vec![secret(false)], false, Box::new(Broken));
    let e = step(&mut t, &kv(&[("CHAP_A", "5")])).unwrap_err();
    assert!(e.contains("no entropy"), "{e}");
    let mut i = ChapInitiator::with_random(
        ChapInitiatorConfig {
            mutual: Some(ChapCredentials::new(MUSER, MSECRET)),
            ..ChapInitiatorConfig::new(ChapCredentials::new(USER, SECRET))
        },
        Box::new(Broken),
    );
    i.offer().unwrap();
    assert!(i
        .respond(&kv(&[("CHAP_A", "5"), ("CHAP_I", "1"), ("CHAP_C", "0x0102")]))
        .is_err());
    // A source that repeats the target's challenge is caught too.
    let mut i = ChapInitiator::with_random(
        ChapInitiatorConfig {
            mutual: Some(ChapCredentials::new(MUSER, MSECRET)),
            ..ChapInitiatorConfig::new(ChapCredentials::new(USER, SECRET))
        },
        Box::new(|b: &mut [u8]| b.fill(0x11)),
    );
    i.offer().unwrap();
    let e = i.respond(&kv(&[
        ("CHAP_A", "5"),
        ("CHAP_I", "1"),
        ("CHAP_C", &encode_hex(&[0x11; 16])),
    ]));
    assert_eq!(e, Err(ChapError::ReflectedChallenge));
}

#[test]
fn secrets_stay_out_of_debug_and_errors() {
    let s = secret(true);
    let mut t = ChapTarget::with_random(vec![s.clone()], true, counter(1));
    let mut i = initiator(&ChapAlgorithm::ALL, true);
    exchange(&mut t, &mut i).unwrap();
    let creds = ChapCredentials::new(USER, SECRET);
    let texts = [
        format!("{s:?}"),
        format!("{t:?}"),
        format!("{i:?}"),
        format!("{creds:?}"),
        format!("{:?}", i.config()),
        format!("{:?}", crate::login::AuthPolicy::Required(Box::new(target(true)))),
    ];
    for text in &texts {
        assert!(!text.contains(SECRET) && !text.contains(MSECRET), "{text}");
    }
    assert!(
        texts[0].contains(USER) && texts[0].contains("<redacted>"),
        "{}",
        texts[0]
    );
    assert!(texts[1].contains("Done"), "{}", texts[1]);
}

#[test]
fn credentials_from_the_command_line() {
    assert_eq!(ChapCredentials::parse("u:p"), Ok(ChapCredentials::new("u", "p")));
    assert_eq!(
        ChapCredentials::parse("iqn.2016-06.io.riser:t:p"),
        Ok(ChapCredentials::new("iqn.2016-06.io.riser:t", "p"))
    );
    for bad in ["", "u", "u:", ":p", &format!("{}:p", "u".repeat(256))] {
        assert!(ChapCredentials::parse(bad).is_err(), "{bad}");
    }
}

/// Garbage in every step: failures, never a panic.
#[test]
fn garbage_never_panics() {
    let names = ["CHAP_A", "CHAP_I", "CHAP_C", "CHAP_N", "CHAP_R", "CHAP_Z"];
    let values = [
        "",
        "0",
        "5",
        "7,5",
        "256",
        "-1",
        "0x",
        "0b",
        "0x0",
        "0xzz",
        "0b====",
        "0b/+/+",
        "0x00ff",
        "é",
        "\u{0}",
        "5,",
        ",",
        "0XAB",
        "0B",
        "99999999999999999999999",
    ];
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = |n: usize| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % n as u64) as usize
    };
    for _ in 0..2000 {
        let mut t = target(next(2) == 0);
        let mut i = initiator(&ChapAlgorithm::ALL, next(2) == 0);
        let _ = i.offer();
        for _ in 0..3 {
            let keys: Pairs = (0..next(5))
                .map(|_| {
                    (
                        names[next(names.len())].to_string(),
                        values[next(values.len())].to_string(),
                    )
                })
                .collect();
            let mut out = Pairs::new();
            let _ = t.step(&keys, &mut out);
            let _ = i.respond(&keys);
            let _ = i.verify(&keys);
        }
    }
}

/// A user whose response is right but whose authorizer refuses fails with Authorization
/// Failure, before the target answers mutual CHAP; others are let through.
#[test]
fn an_authorizer_refuses_after_the_secret_checked_out() {
    let authorizer = || -> Authorizer {
        Box::new(|user: &str| match user {
            USER => Err(format!("{user} may not log in as this initiator")),
            _ => Ok(()),
        })
    };
    for mutual in [false, true] {
        let mut t = target(false).with_authorizer(authorizer());
        let mut i = initiator(&[ChapAlgorithm::Sha256], mutual);
        let err = exchange(&mut t, &mut i).expect_err("refused");
        assert_eq!(err, format!("authenticated but not authorized: {USER} may not log in as this initiator"));
        assert_eq!(t.failure(), Some(&ChapError::NotAuthorized(format!("{USER} may not log in as this initiator"))));
        assert_eq!(t.failure_status(), LoginStatus::AUTHORIZATION_FAILURE);
        assert!(t.authenticated_user().is_none());
    }
    // The authorizer is asked only once the response is right: a wrong secret stays an
    // authentication failure.
    let mut t = target(false).with_authorizer(authorizer());
    let mut i = ChapInitiator::with_random(
        ChapInitiatorConfig::new(ChapCredentials::new(USER, "not-the-secret")),
        counter(200),
    );
    assert!(exchange(&mut t, &mut i).unwrap_err().starts_with("wrong CHAP response"));
    assert_eq!(t.failure_status(), LoginStatus::AUTHENTICATION_FAILURE);
    // Allowed: the exchange completes as without one.
    let mut t = target(true).with_authorizer(Box::new(|_: &str| Ok(())));
    let mut i = initiator(&[ChapAlgorithm::Md5], true);
    exchange(&mut t, &mut i).unwrap();
    assert_eq!(t.authenticated_user(), Some(USER));
}
