"""scikit-learn's own estimator checks, for every outcore estimator. The
few expected to fail are listed, with their reasons, by the estimators
(``_expected_failed_checks``)."""
from sklearn.utils.estimator_checks import parametrize_with_checks

import outcore


def expected_failures(est):
    return getattr(est, "_expected_failed_checks", {})


@parametrize_with_checks(
    [
        outcore.KMeans(n_clusters=3, mem_cap="64MiB", n_jobs=2),
        outcore.MiniBatchKMeans(n_clusters=3, mem_cap="64MiB", n_jobs=2),
        outcore.LogisticRegression(mem_cap="64MiB", n_jobs=2),
        outcore.LinearRegression(mem_cap="64MiB", n_jobs=2),
        outcore.Ridge(mem_cap="64MiB", n_jobs=2),
        outcore.PCA(mem_cap="64MiB", n_jobs=2),
        outcore.IncrementalPCA(mem_cap="64MiB", n_jobs=2),
        outcore.SGDClassifier(mem_cap="64MiB", n_jobs=2),
        outcore.SGDRegressor(mem_cap="64MiB", n_jobs=2),
    ],
    expected_failed_checks=expected_failures,
)
def test_sklearn_compatible_estimator(estimator, check):
    check(estimator)
