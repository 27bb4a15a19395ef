"""Supervised learning on top of the autoencoder: fine-tuning (shallow and deep), layer-wise
pretraining, and the baselines of Table fn_mnist (RBM, dropout and denoising autoencoders).

May import: the algorithm, gpu, datasets, training, evaluation.
"""
