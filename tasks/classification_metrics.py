"""Macro-F1 over a confusion matrix: on a skewed label set, accuracy can be high while
the rare classes are never predicted; macro-F1 weighs every class the same."""

import keras
import tensorflow as tf


class MacroF1(keras.metrics.Metric):
    """Counts of [true class, predicted class] (summed over replicas); the result is the
    mean F1 over the classes that occur as a label or a prediction (scikit-learn's
    `f1_score(average="macro")`), and `matrix` the counts, for the eval's table."""

    def __init__(self, num_classes, name="macro_f1"):
        super().__init__(name=name)
        self.num_classes = num_classes
        self.matrix = self.add_variable(shape=(num_classes, num_classes), initializer="zeros",
                                        name="matrix", aggregation="sum")

    def update_state(self, labels, logits, sample_weight=None):
        predicted = tf.argmax(logits, axis=-1, output_type=tf.int32)
        self.matrix.assign_add(tf.math.confusion_matrix(
            tf.reshape(tf.cast(labels, tf.int32), [-1]), tf.reshape(predicted, [-1]),
            self.num_classes, dtype=tf.float32))

    def result(self):
        m = tf.convert_to_tensor(self.matrix)
        true_positives = tf.linalg.diag_part(m)
        # 2TP + FP + FN = (labels of the class) + (predictions of it)
        support = tf.reduce_sum(m, axis=1) + tf.reduce_sum(m, axis=0)
        present = support > 0
        f1 = tf.math.divide_no_nan(2.0 * true_positives, support)
        return tf.math.divide_no_nan(tf.reduce_sum(tf.where(present, f1, 0.0)),
                                     tf.reduce_sum(tf.cast(present, tf.float32)))

    def reset_state(self):
        self.matrix.assign(tf.zeros_like(self.matrix))


def confusion_table(matrix, label_names, max_classes=50):
    """Markdown: a row per true class, a column per predicted class (the first
    `max_classes` by support when there are more)."""
    counts = matrix.astype(int)
    order = sorted(range(len(label_names)), key=lambda i: -counts[i].sum())[:max_classes]
    order.sort()
    header = "| true \\ predicted | " + " | ".join(label_names[i] for i in order) + " |"
    rows = [header, "|" + "---|" * (len(order) + 1)]
    rows += [f"| **{label_names[i]}** | " + " | ".join(str(counts[i, j]) for j in order)
             + " |" for i in order]
    if len(order) < len(label_names):
        rows.append(f"\n({len(label_names) - len(order)} classes with the fewest examples "
                    "left out.)")
    return "\n".join(rows)
