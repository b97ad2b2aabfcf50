//! A dimension: a polynomial with integer coefficients in atoms, each atom
//! a size nothing more is known of (a declared symbol `$batch`, axis i of a
//! graph value `x#1`, `min(e, n)`). Atoms are sizes, never negative, so a
//! polynomial whose coefficients are all positive is a size too. Equal
//! polynomials are equal numbers at run time, whatever the atoms are: a
//! cache's `past + seq` written two ways is one dimension.

/// The most terms a product may have (real exports' have a few).
const MAX_TERMS: usize = 64;

/// `coef × atoms[0] × atoms[1] × …` (atoms sorted).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Term {
    coef: i64,
    atoms: Vec<String>,
}

/// A sum of terms: sorted by their atoms (the number last), no two with the
/// same atoms, none with coefficient 0; no term at all is 0.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Dim {
    terms: Vec<Term>,
}

impl Dim {
    pub fn known(n: i64) -> Self {
        Dim::sum(vec![Term { coef: n, atoms: vec![] }]).expect("one term cannot overflow")
    }

    pub(super) fn atom(name: String) -> Self {
        Dim { terms: vec![Term { coef: 1, atoms: vec![name] }] }
    }

    /// Like terms merged, zeros dropped, in canonical order; none where a
    /// coefficient overflows.
    fn sum(mut terms: Vec<Term>) -> Option<Dim> {
        for t in &mut terms {
            t.atoms.sort();
        }
        terms.sort_by(|a, b| (a.atoms.is_empty(), &a.atoms).cmp(&(b.atoms.is_empty(), &b.atoms)));
        let mut merged: Vec<Term> = Vec::with_capacity(terms.len());
        for t in terms {
            match merged.last_mut() {
                Some(last) if last.atoms == t.atoms => last.coef = last.coef.checked_add(t.coef)?,
                _ => merged.push(t),
            }
        }
        merged.retain(|t| t.coef != 0);
        Some(Dim { terms: merged })
    }

    pub fn value(&self) -> Option<i64> {
        match self.terms.as_slice() {
            [] => Some(0),
            [t] if t.atoms.is_empty() => Some(t.coef),
            _ => None,
        }
    }

    /// `(atom, c)` where the dimension is `c · atom`.
    pub(super) fn single_atom(&self) -> Option<(&str, i64)> {
        match self.terms.as_slice() {
            [Term { coef, atoms }] => match atoms.as_slice() {
                [atom] => Some((atom.as_str(), *coef)),
                _ => None,
            },
            _ => None,
        }
    }

    /// `(atom, a, c)` where the dimension is `a · atom + c`.
    pub(super) fn linear(&self) -> Option<(&str, i64, i64)> {
        let (with, number): (Vec<&Term>, Vec<&Term>) = self.terms.iter().partition(|t| !t.atoms.is_empty());
        match (with.as_slice(), number.as_slice()) {
            ([t], rest) if t.atoms.len() == 1 => Some((t.atoms[0].as_str(), t.coef, rest.first().map_or(0, |c| c.coef))),
            _ => None,
        }
    }

    /// The least it can be where each atom is at least `bound(atom)` (at
    /// least 0): none where a term with atoms is subtracted.
    pub(super) fn least(&self, bound: impl Fn(&str) -> i64) -> Option<i64> {
        self.terms.iter().try_fold(0i64, |sum, t| {
            let term = t.atoms.iter().try_fold(t.coef, |p, a| p.checked_mul(bound(a).max(0)))?;
            (t.atoms.is_empty() || t.coef > 0).then_some(())?;
            sum.checked_add(term)
        })
    }

    /// Every atom it names (an atom of several terms more than once).
    pub(super) fn atoms(&self) -> impl Iterator<Item = &String> {
        self.terms.iter().flat_map(|t| &t.atoms)
    }

    /// A size that is no number: atoms with positive coefficients, so never
    /// negative (shape elements are sizes; only Neg and Sub make a negative
    /// coefficient).
    pub(super) fn is_dimension(&self) -> bool {
        self.atoms().next().is_some() && self.terms.iter().all(|t| t.coef > 0)
    }

    /// Never negative: a number of at least 0 or a dimension.
    pub fn is_size(&self) -> bool {
        self.value().map_or_else(|| self.is_dimension(), |n| n >= 0)
    }

    /// The number, given the values of the declared symbols (atoms `$name`);
    /// none where another atom is in it (no number is known of it).
    pub fn evaluate(&self, symbol: &dyn Fn(&str) -> Option<i64>) -> Option<u128> {
        let term = |t: &Term| {
            t.atoms.iter().try_fold(i128::from(t.coef), |n, a| n.checked_mul(i128::from(symbol(a.strip_prefix('$')?)?)))
        };
        let total = self.terms.iter().try_fold(0i128, |n, t| n.checked_add(term(t)?))?;
        u128::try_from(total).ok()
    }

    pub fn add(&self, other: &Dim) -> Option<Dim> {
        Dim::sum([self.terms.clone(), other.terms.clone()].concat())
    }

    pub fn neg(&self) -> Option<Dim> {
        let terms = self.terms.iter().map(|t| Some(Term { coef: t.coef.checked_neg()?, atoms: t.atoms.clone() }));
        Some(Dim { terms: terms.collect::<Option<_>>()? })
    }

    pub fn sub(&self, other: &Dim) -> Option<Dim> {
        self.add(&other.neg()?)
    }

    /// The product; none where a coefficient overflows, or where it would
    /// have more than `MAX_TERMS` terms (a hostile model's product of many
    /// sums), which are unknown.
    pub fn mul(&self, other: &Dim) -> Option<Dim> {
        let n = self.terms.len().checked_mul(other.terms.len()).filter(|&n| n <= MAX_TERMS)?;
        let mut terms = Vec::with_capacity(n);
        for a in &self.terms {
            for b in &other.terms {
                terms.push(Term {
                    coef: a.coef.checked_mul(b.coef)?,
                    atoms: [a.atoms.clone(), b.atoms.clone()].concat(),
                });
            }
        }
        Dim::sum(terms)
    }

    /// Exact division: the quotient q with `other · q = self` where one is a
    /// polynomial of these atoms; none where none is found.
    pub(super) fn div(&self, other: &Dim) -> Option<Dim> {
        let divisor = other.terms.first()?;
        if let [_] = other.terms.as_slice() {
            let terms = self.terms.iter().map(|t| term_div(t, divisor));
            return Dim::sum(terms.collect::<Option<_>>()?);
        }
        // Each term of self over the divisor's first: the quotient is a
        // monomial, or none of these.
        self.terms
            .iter()
            .filter_map(|t| term_div(t, divisor))
            .map(|q| Dim { terms: vec![q] })
            .find(|q| other.mul(q).as_ref() == Some(self))
    }

    /// `(q, r)` with self = s·q + r: q the terms whose coefficients s
    /// divides (over s), r the rest (its constant whole).
    pub(super) fn split_divisible(&self, s: i64) -> Option<(Dim, Dim)> {
        let (mut whole, mut rest) = (vec![], vec![]);
        for t in &self.terms {
            if !t.atoms.is_empty() && t.coef.checked_rem(s)? == 0 {
                whole.push(Term { coef: t.coef / s, atoms: t.atoms.clone() });
            } else {
                rest.push(t.clone());
            }
        }
        Some((Dim::sum(whole)?, Dim::sum(rest)?))
    }

    /// The constant term (0 where there is none).
    pub(super) fn value_of_constant(&self) -> i64 {
        self.terms.iter().find(|t| t.atoms.is_empty()).map_or(0, |t| t.coef)
    }

    /// Every atom `value` gives a value replaced by it; a term whose value
    /// overflows stays as it is.
    pub(super) fn substitute(&self, value: impl Fn(&str) -> Option<Dim>) -> Dim {
        let terms = self.terms.iter().flat_map(|t| {
            let replaced = t
                .atoms
                .iter()
                .try_fold(Dim::known(t.coef), |p, a| p.mul(&value(a).unwrap_or_else(|| Dim::atom(a.clone()))));
            replaced.map_or_else(|| vec![t.clone()], |d| d.terms)
        });
        Dim::sum(terms.collect()).unwrap_or_else(|| self.clone())
    }

    /// A name that tells dimensions apart (`1·$seq`, `1·$past + 1·$seq`).
    pub(super) fn key(&self) -> String {
        let term = |t: &Term| [vec![t.coef.to_string()], t.atoms.clone()].concat().join("·");
        let terms: Vec<String> = self.terms.iter().map(term).collect();
        if terms.is_empty() {
            "0".to_string()
        } else {
            terms.join(" + ")
        }
    }
}

/// `a / b` for monomials, where b divides a.
fn term_div(a: &Term, b: &Term) -> Option<Term> {
    if a.coef.checked_rem(b.coef)? != 0 {
        return None;
    }
    let mut atoms = a.atoms.clone();
    for x in &b.atoms {
        let i = atoms.iter().position(|y| y == x)?;
        atoms.remove(i);
    }
    Some(Term { coef: a.coef.checked_div(b.coef)?, atoms })
}

/// The product of dimensions (1 for none); none where it overflows.
pub fn product(dims: &[Dim]) -> Option<Dim> {
    dims.iter().try_fold(Dim::known(1), |p, d| p.mul(d))
}

impl std::fmt::Display for Dim {
    /// `batch·seq`, `past + seq`, `2·seq - 1`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.terms.is_empty() {
            return f.write_str("0");
        }
        for (i, t) in self.terms.iter().enumerate() {
            let coef = if i == 0 {
                t.coef
            } else {
                f.write_str(if t.coef < 0 { " - " } else { " + " })?;
                t.coef.checked_abs().unwrap_or(t.coef)
            };
            let mut parts: Vec<String> = t.atoms.iter().map(|a| a.trim_start_matches('$').to_string()).collect();
            if coef != 1 || parts.is_empty() {
                parts.insert(0, coef.to_string());
            }
            f.write_str(&parts.join("·"))?;
        }
        Ok(())
    }
}
